#!/usr/bin/env bash
# llmslo's TPOT per request on the Responses API against the engine's own figure for the same
# request, on a real vLLM (CPU, the `small` model of the vLLM-on-CPU runner that VLLM_SH names)
# started with --enable-per-request-metrics, which states each request's mean inter-token
# latency in `response.completed`.
#
# CLIENTS closed-loop clients send sampled requests (temperature 1, so that some tokens are
# held back: a random model's tokens are often parts of a UTF-8 character) through the sidecar
# for LOAD. Per request, the sidecar's debug line carries both figures (tpot_ms, engine_tpot_ms);
# the table gives the error of llmslo's against the engine's and the share within 5 %.
#
#   scripts/responses-tpot-vs-vllm.sh
#   CLIENTS=8 LOAD=120s TOKENS=64 scripts/responses-tpot-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # vLLM; the sidecar takes PORT+1 (proxy) and PORT+2 (metrics)
CLIENTS=${CLIENTS:-8}
LOAD=${LOAD:-90s}
TOKENS=${TOKENS:-64}
WORK=$(mktemp -d)
export VLLM_EXTRA_ARGS="--enable-per-request-metrics ${VLLM_ARGS:-}"
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT" "$((PORT + 1))" "$((PORT + 2))"
trap 'kill ${ENGINE_PID:-} ${SIDECAR_PID:-} 2>/dev/null || true' EXIT
start_vllm

write_prompts "$WORK/prompts.jsonl" 400 32
write_sidecar_config <<YAML
log: info,llmslo=debug
log_format: json
slos:
  - {name: tpot, objective: 95, tpot: 200ms}
YAML
start_sidecar llmslo.log

echo "$CLIENTS clients on the Responses API for $LOAD ..."
"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$((PORT + 1))" --model small \
    --config "$WORK/llmslo.yaml" --dataset "$WORK/prompts.jsonl" --output-tokens "$TOKENS" --endpoint responses \
    --concurrency "$CLIENTS" --duration "$LOAD" --warmup 5s >/dev/null

python3 - "$WORK/llmslo.log" "$CLIENTS" <<'PY'
import json, sys
path, clients = sys.argv[1], sys.argv[2]
errors = []
for line in open(path):
    try:
        f = json.loads(line).get("fields", {})
    except ValueError:
        continue
    if f.get("message") == "request finished" and f.get("operation") == "responses" \
            and f.get("tpot_ms") and f.get("engine_tpot_ms"):
        errors.append((f["tpot_ms"] - f["engine_tpot_ms"]) / f["engine_tpot_ms"])
if not errors:
    sys.exit("no request logged both figures")
errors.sort()
def pct(q):
    return errors[min(len(errors) - 1, int(q * len(errors)))] * 100
within = sum(abs(e) <= 0.05 for e in errors) / len(errors) * 100
mean = sum(errors) / len(errors) * 100
print("| clients | requests | mean error | p5 / p50 / p95 error | worst | within 5 % |")
print("| --- | --- | --- | --- | --- | --- |")
print(f"| {clients} | {len(errors)} | {mean:+.1f} % | {pct(0.05):+.1f} / {pct(0.5):+.1f} / {pct(0.95):+.1f} % "
      f"| {max(errors, key=abs) * 100:+.1f} % | {within:.1f} % |")
PY
