#!/usr/bin/env bash
# `llmslo sweep --compare` on real vLLM engines (CPU, the `small` model of the vLLM-on-CPU runner
# that VLLM_SH names, both on one core: the comparison runs one target at a time) — not part of
# CI. A/A: the default engine against itself, where the verdict must be no measurable
# difference. A/B: the default engine against one started with `--max-num-seqs 2`, which
# queues what does not fit in its batch, where the verdict must name the TTFT it costs.
#
#   scripts/compare-vs-vllm.sh                  loads 1 and 2 req/s, 5 repetitions of 10 s
#   RATES=1,2,3 REPETITIONS=5 scripts/compare-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # A; B takes PORT+1
RATES=${RATES:-1,2}
REPETITIONS=${REPETITIONS:-5}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

A=$PORT B=$((PORT + 1))
require_free_ports "$A" "$B"
trap 'kill ${A_PID:-} ${ENGINE_PID:-} 2>/dev/null || true' EXIT
start_vllm
A_PID=$ENGINE_PID
PORT=$B VLLM_EXTRA_ARGS="--max-num-seqs 2 ${VLLM_EXTRA_ARGS:-}" start_vllm

cat >"$WORK/slo.yaml" <<'YAML'
slos:
  - {name: ttft-1s, objective: 90, ttft: 1s}
  - {name: tpot-60ms, objective: 90, tpot: 60ms}
YAML

compare() {
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --compare "http://127.0.0.1:$1" "http://127.0.0.1:$2" \
        --model small --config "$WORK/slo.yaml" --rate "$RATES" --repetitions "$REPETITIONS" --duration 10s \
        --warmup 2s --prompt-tokens 64 --output-tokens 32 --json "$WORK/$3.json" 2>/dev/null | tee "$WORK/$3.txt"
}
echo "== A/A: the default engine against itself =="
compare "$A" "$A" aa
echo; echo "== A/B: the default engine (A) against --max-num-seqs 2 (B) =="
compare "$A" "$B" ab
python3 - "$WORK" <<'PY'
import json, sys
verdicts = {run: json.load(open(f"{sys.argv[1]}/{run}.json"))["verdict"]["summary"] for run in ("aa", "ab")}
print(f"\nA/A: {verdicts['aa']}\nA/B: {verdicts['ab']}")
same = lambda summary: summary.endswith("no measurable difference")
sys.exit(0 if same(verdicts["aa"]) and not same(verdicts["ab"]) else 1)
PY
