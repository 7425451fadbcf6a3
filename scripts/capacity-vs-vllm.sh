#!/usr/bin/env bash
# The live capacity estimate against the truth on a real vLLM (CPU, the `small` model of the
# vLLM-on-CPU runner that VLLM_SH names). First `llmslo sweep --rate` finds the truth: the highest
# Poisson arrival rate whose TPOT attainment meets the objective. Then Poisson traffic at 20 %,
# 40 % and 60 % of that rate goes through the sidecar, which never sees the knee, and its
# gauges are read every 5 s; the table shows the mean of each phase's last 30 s.
#
#   scripts/capacity-vs-vllm.sh                       tpot 100 ms at 95 %
#   TPOT=80ms RATES=1,2,3,4 STEP=60s PHASE=120s scripts/capacity-vs-vllm.sh
#   TRUTH=target/sweep.json scripts/capacity-vs-vllm.sh   the live phases against an earlier truth
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # vLLM; the sidecar takes PORT+1 (proxy) and PORT+2 (metrics)
TPOT=${TPOT:-100ms}
RATES=${RATES:-1,1.5,2,2.5,3,3.5,4,4.5,5}   # the truth's steps, requests per second
STEP=${STEP:-60s}            # each truth step's window
PHASE=${PHASE:-120s}         # each live phase
OUTPUT_LEN=${OUTPUT_LEN:-32}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT" "$((PORT + 1))" "$((PORT + 2))"
trap 'kill ${ENGINE_PID:-} ${SIDECAR_PID:-} ${SCRAPER_PID:-} 2>/dev/null || true' EXIT
start_vllm

write_prompts "$WORK/prompts.jsonl" 400 32
write_sidecar_config <<YAML
slos:
  - {name: tpot, objective: 95, tpot: $TPOT}
goodput:
  require: [tpot]
YAML

if [ -n "${TRUTH:-}" ]; then
    echo "the truth: $TRUTH, an earlier run's sweep"
    cp "$TRUTH" "$WORK/sweep.json"
else
    echo "the truth: llmslo sweep --rate $RATES against vLLM ..."
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$PORT" --model small \
        --config "$WORK/llmslo.yaml" --dataset "$WORK/prompts.jsonl" --output-tokens "$OUTPUT_LEN" \
        --rate "$RATES" --duration "$STEP" --warmup 10s --json "$WORK/sweep.json" | tee "$WORK/sweep.txt"
fi

# The first miss the next step confirms, interpolated from the step before it.
knee=$(python3 - "$WORK/sweep.json" <<'PY'
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
# Steps with too few requests to judge (the sweep's own verdict) say nothing either way.
steps = [s for s in steps if s["verdicts"]["tpot"]["verdict"] != "unjudged"]
margins = [s["attainment"]["tpot"] - 0.95 for s in steps]
rates = [s["rate"] for s in steps]
miss = next((k for k in range(1, len(steps)) if margins[k] < 0 and (k + 1 == len(steps) or margins[k + 1] < 0)), None)
if miss is None or margins[0] < 0:
    sys.exit(f"the knee is not within the rates: margins {margins}")
above, below = max(margins[miss - 1], 0.0), margins[miss]
print(f"{rates[miss - 1] + (rates[miss] - rates[miss - 1]) * above / (above - below):.3f}")
PY
)
echo "true knee: $knee req/s; the sidecar in front of vLLM, Poisson traffic at 20, 40 and 60 % of it ..."
start_sidecar sidecar.log
# Every 5 s: the time and the three gauges.
(while true; do
    sleep 5
    curl -sf "http://127.0.0.1:$((PORT + 2))/metrics" | awk -v t="$(date +%s)" '
        /^llmslo_slo_saturation_ratio / {s=$2} /^llmslo_capacity_knee_requests_per_second / {k=$2}
        /^llmslo_capacity_load_requests_per_second / {l=$2} END {print t, s, k, l}'
done) >"$WORK/scrapes.txt" &
SCRAPER_PID=$!
for share in 0.2 0.4 0.6; do
    rate=$(python3 -c "print(round($knee * $share, 3))")
    echo "$share $(date +%s)" >>"$WORK/phases.txt"
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$((PORT + 1))" \
        --model small --config "$WORK/llmslo.yaml" --dataset "$WORK/prompts.jsonl" \
        --output-tokens "$OUTPUT_LEN" --rate "$rate" --duration "$PHASE" --warmup 0s | tee -a "$WORK/traffic.txt"
done
echo "end $(date +%s)" >>"$WORK/phases.txt"
kill "$SCRAPER_PID"
cp "$WORK"/sweep.json "$WORK"/scrapes.txt "$WORK"/phases.txt "$ROOT/target/" 2>/dev/null || true

python3 - "$WORK" "$knee" <<'PY'
import sys
work, knee = sys.argv[1], float(sys.argv[2])
phases = [line.split() for line in open(f"{work}/phases.txt")]
scrapes = [tuple(map(float, line.split())) for line in open(f"{work}/scrapes.txt") if len(line.split()) == 4]
print(f"\ntrue knee (llmslo sweep --rate): {knee:.2f} req/s\n")
print("| offered | capacity | diff | saturation | truth |")
print("| --- | --- | --- | --- | --- |")
for (share, start), (_, end) in zip(phases, phases[1:]):
    last = [s for s in scrapes if float(end) - 30 <= s[0] <= float(end)]
    if not last:
        continue
    saturation = sum(s[1] for s in last) / len(last)
    capacity = sum(s[2] for s in last) / len(last)
    print(f"| {float(share) * knee:.2f} req/s ({float(share) * 100:.0f} %) | {capacity:.2f} req/s | "
          f"{100 * (capacity / knee - 1):+.0f} % | {saturation:.2f} | {float(share):.2f} |")
PY
