#!/usr/bin/env bash
# The engine's own view against llmslo's, per request, on a real vLLM (CPU, the `small` model of
# the vLLM-on-CPU runner that VLLM_SH names) started with --enable-per-request-metrics.
#
# Through the sidecar: COUNT sequential requests on an idle engine, then CLIENTS closed-loop
# clients for LOAD. For each request llmslo logs its own TTFT and the engine's queue and prefill
# (scheduling to first token) times; the table shows llmslo's TTFT minus the engine's (the time
# outside the engine), the engine's queue time, and the queue depth llmslo read from the
# engine's /metrics as the request arrived. Last, the bytes a client gets through the sidecar
# against the bytes straight from vLLM, for the same greedy request without include_usage.
#
#   scripts/phases-vs-vllm.sh
#   COUNT=50 CLIENTS=8 LOAD=90s scripts/phases-vs-vllm.sh
#   VLLM_ARGS="--max-num-seqs 4" scripts/phases-vs-vllm.sh     a batch of 4: the rest queue
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # vLLM; the sidecar takes PORT+1 (proxy) and PORT+2 (metrics)
COUNT=${COUNT:-30}
CLIENTS=${CLIENTS:-8}
LOAD=${LOAD:-60s}
WORK=$(mktemp -d)
export VLLM_EXTRA_ARGS="--enable-per-request-metrics ${VLLM_ARGS:-}"
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT" "$((PORT + 1))" "$((PORT + 2))"
trap 'kill ${ENGINE_PID:-} ${SIDECAR_PID:-} 2>/dev/null || true' EXIT
start_vllm

write_prompts "$WORK/prompts.jsonl" 400 32
write_sidecar_config <<YAML
engine_metrics_interval: 1s
log: info,llmslo=debug
log_format: json
slos:
  - {name: ttft, objective: 99, ttft: 300ms}
  - {name: tpot, objective: 95, tpot: 100ms}
YAML
start_sidecar llmslo.log

sweep() {  # CONCURRENCY DURATION
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$((PORT + 1))" --model small \
        --config "$WORK/llmslo.yaml" --dataset "$WORK/prompts.jsonl" --output-tokens 32 \
        --concurrency "$1" --duration "$2" --warmup 0s >/dev/null
}
mark() { wc -l <"$WORK/llmslo.log"; }

echo "idle: $COUNT sequential requests ..."
start=$(mark)
sweep 1 "$((COUNT * 1))s"
idle_end=$(mark)
echo "load: $CLIENTS clients for $LOAD ..."
sweep "$CLIENTS" "$LOAD"
load_end=$(mark)

python3 - "$WORK/llmslo.log" "$start" "$idle_end" "$load_end" "$CLIENTS" <<'PY'
import json, sys
path, start, idle_end, load_end, clients = sys.argv[1], *map(int, sys.argv[2:6])
lines = open(path).read().splitlines()
def requests(a, b):
    out = []
    for line in lines[a:b]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        f = event.get("fields", {})
        if f.get("message") == "request finished" and f.get("engine_queue_ms") is not None and f.get("ttft_ms"):
            out.append(f)
    return out
def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")
print("| phase | requests | llmslo TTFT p50 | engine TTFT p50 (queue + prefill) | outside the engine p50 / p99 | engine queue p50 / p99 | queue depth at arrival, mean |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, a, b in (("idle, 1 client", start, idle_end), (f"{clients} clients", idle_end, load_end)):
    r = requests(a, b)
    ttft = [x["ttft_ms"] for x in r]
    engine = [x["engine_queue_ms"] + x["engine_prefill_ms"] for x in r]
    outside = [x["ttft_ms"] - x["engine_queue_ms"] - x["engine_prefill_ms"] for x in r]
    queue = [x["engine_queue_ms"] for x in r]
    waiting = [x["engine_waiting_at_arrival"] for x in r if x.get("engine_waiting_at_arrival") is not None]
    mean_waiting = sum(waiting) / len(waiting) if waiting else float("nan")
    print(f"| {name} | {len(r)} | {pct(ttft, .5):.1f} ms | {pct(engine, .5):.1f} ms | {pct(outside, .5):.2f} / {pct(outside, .99):.2f} ms "
          f"| {pct(queue, .5):.2f} / {pct(queue, .99):.2f} ms | {mean_waiting:.2f} |")
PY

echo
echo "causes and the engine's signals, from the sidecar's /metrics:"
curl -s "http://127.0.0.1:$((PORT + 2))/metrics" | grep -E '^llmslo_slo_bad_events_by_cause_total|^llmslo_engine_(scrape_up|requests|kv_cache|preemptions|prefix)' || true

echo
echo "bytes: the same greedy request, straight to vLLM and through the sidecar ..."
python3 - "127.0.0.1:$PORT" "127.0.0.1:$((PORT + 1))" "$WORK" <<'PY'
import json, re, sys, urllib.request
body = json.dumps({"model": "small", "stream": True, "max_tokens": 32, "temperature": 0,
                   "messages": [{"role": "user", "content": "Say something about latency."}]}).encode()
def get(addr):
    request = urllib.request.Request(f"http://{addr}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
    return urllib.request.urlopen(request).read()
direct, proxied = get(sys.argv[1]), get(sys.argv[2])
open(f"{sys.argv[3]}/direct.sse", "wb").write(direct)
open(f"{sys.argv[3]}/proxied.sse", "wb").write(proxied)
# Each answer has its own id and creation time; everything else must be the same bytes.
norm = lambda b: re.sub(rb'"id":"[^"]*"|"created":\d+', b"", b)
same = norm(direct) == norm(proxied)
print(f"direct {len(direct)} bytes, through llmslo {len(proxied)} bytes; identical but for id and created: {same}; "
      f"usage or metrics in what the client got: {b'usage' in proxied or b'metrics' in proxied}")
if not same:
    for a, b in zip(norm(direct).split(b"\n\n"), norm(proxied).split(b"\n\n")):
        if a != b:
            print("first difference:\n  direct:  ", a[:300], "\n  proxied: ", b[:300])
            break
PY
