#!/usr/bin/env bash
# Captures the Responses and Messages answers of a real vLLM (CPU, the `small` model of the
# vLLM-on-CPU runner that VLLM_SH names) under CLIENTS concurrent clients, sampled (so that some
# tokens are held back), every event with its arrival time, for the tests that replay them
# (tests/fixtures/load/). vLLM runs with --enable-per-request-metrics, so each Responses
# answer states the engine's own mean inter-token latency in `response.completed`.
#
#   scripts/capture-load.sh
#   CLIENTS=8 COUNT=160 TOKENS=64 scripts/capture-load.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}
CLIENTS=${CLIENTS:-8}
COUNT=${COUNT:-160}
TOKENS=${TOKENS:-64}
OUT=${OUT:-$ROOT/tests/fixtures/load}
WORK=$(mktemp -d)
export VLLM_EXTRA_ARGS="--enable-per-request-metrics ${VLLM_ARGS:-}" NO_LLMSLO=1
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT"
trap 'kill ${ENGINE_PID:-} 2>/dev/null || true' EXIT
start_vllm
write_prompts "$WORK/prompts.jsonl" 400 32
mkdir -p "$OUT"
for api in responses messages; do
    "${PIN_CLIENT[@]}" python3 "$ROOT/scripts/capture_load.py" "127.0.0.1:$PORT" "$api" small "$WORK/prompts.jsonl" \
        "$CLIENTS" "$COUNT" "$TOKENS" "$OUT/$api-$CLIENTS-clients.jsonl.gz"
done
