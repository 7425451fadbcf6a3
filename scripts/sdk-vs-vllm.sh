#!/usr/bin/env bash
# Opt-in check of the Responses and Messages APIs against a real vLLM (CPU, the `small` model
# of the vLLM-on-CPU runner that VLLM_SH names) with the official `openai` and `anthropic` Python SDKs as
# the clients — not part of CI. Rounds of sequential requests (chat completions,
# `responses.create(stream=True)`, `messages.stream`) go through llmslo; scripts/sdk_client.py
# stamps every SDK event and fails unless every request is a success, llmslo's token counts
# equal the SDK's usage, llmslo's TTFT comes before the SDK sees its first token (the SDKs
# parse each event in Python: 1.5 to 3 ms later), and, per API, llmslo's mean TPOT is within
# 3 % of chat's. Then scripts/raw_client.py, a raw-socket client, holds llmslo's per-request
# TTFT on each API to 1 ms.
#
#   scripts/sdk-vs-vllm.sh                 20 rounds of 64 output tokens
#   ROUNDS=40 OUTPUT_LEN=32 scripts/sdk-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # vLLM; the sidecar takes PORT+1 (proxy) and PORT+2 (metrics)
ROUNDS=${ROUNDS:-20}
OUTPUT_LEN=${OUTPUT_LEN:-64}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT" "$((PORT + 1))" "$((PORT + 2))"
trap 'kill ${ENGINE_PID:-} ${SIDECAR_PID:-} 2>/dev/null || true' EXIT
SDK="$VLLM_DIR/sdk"
[ -x "$SDK/bin/python" ] || { python3 -m venv "$SDK" && "$SDK/bin/pip" install -q openai anthropic; }
start_vllm

"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" run --upstream "http://127.0.0.1:$PORT" --engine vllm \
    --listen "127.0.0.1:$((PORT + 1))" --metrics-listen "127.0.0.1:$((PORT + 2))" \
    --log llmslo=debug --log-format json >"$WORK/llmslo.log" 2>&1 &
SIDECAR_PID=$!
for _ in $(seq 1 50); do
    curl -sf "http://127.0.0.1:$((PORT + 2))/readyz" >/dev/null && break
    sleep 0.2
done
curl -sf "http://127.0.0.1:$((PORT + 2))/readyz" >/dev/null || { cat "$WORK/llmslo.log"; exit 1; }

echo "SDK versions: $("$SDK/bin/python" -c 'import openai, anthropic; print("openai", openai.__version__, "anthropic", anthropic.__version__)')"
ok=0
"${PIN_CLIENT[@]}" "$SDK/bin/python" "$ROOT/scripts/sdk_client.py" "http://127.0.0.1:$((PORT + 1))" small \
    "$WORK/llmslo.log" "$ROUNDS" "$OUTPUT_LEN" || ok=1
for api in chat responses messages; do
    "${PIN_CLIENT[@]}" python3 "$ROOT/scripts/raw_client.py" ttft "127.0.0.1:$((PORT + 1))" "$WORK/llmslo.log" \
        small "$ROUNDS" "$api" || ok=1
done
exit $ok
