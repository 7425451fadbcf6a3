#!/usr/bin/env bash
# The live capacity estimate against the sweep's knee on a real vLLM (CPU, the `small` model of
# the vLLM-on-CPU runner that VLLM_SH names). First `llmslo sweep --concurrency auto` finds the knee by
# pushing the engine through it; then Poisson traffic at 10 % to 50 % of the knee goes through
# the sidecar, which never sees the knee, and its `llmslo_capacity_*` gauges are read.
#
#   scripts/capacity-vs-vllm.sh                   tpot 100 ms at 95 %, 60 s per rate
#   TPOT=80ms STEP=90s scripts/capacity-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # vLLM; the sidecar takes PORT+1 (proxy) and PORT+2 (metrics)
TPOT=${TPOT:-100ms}
STEP=${STEP:-60s}            # each Poisson rate's window
OUTPUT_LEN=${OUTPUT_LEN:-32}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT" "$((PORT + 1))" "$((PORT + 2))"
trap 'kill ${ENGINE_PID:-} ${SIDECAR_PID:-} 2>/dev/null || true' EXIT
start_vllm

write_prompts "$WORK/prompts.jsonl" 400 32
cat >"$WORK/llmslo.yaml" <<YAML
upstream: http://127.0.0.1:$PORT
listen: 127.0.0.1:$((PORT + 1))
metrics_listen: 127.0.0.1:$((PORT + 2))
engine: vllm
slos:
  - {name: tpot, objective: 95, tpot: $TPOT}
goodput:
  require: [tpot]
YAML

echo "llmslo sweep --concurrency auto against vLLM ..."
"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$PORT" --model small \
    --config "$WORK/llmslo.yaml" --dataset "$WORK/prompts.jsonl" --output-tokens "$OUTPUT_LEN" \
    --duration 30s --warmup 5s --json "$WORK/sweep.json" | tee "$WORK/sweep.txt"

# Poisson rates whose concurrency runs from about 10 % to 50 % of the knee: fractions of the
# throughput the sweep measured at the step nearest half the knee.
rates=$(python3 - "$WORK/sweep.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
knee = report["knee"]["concurrency"]
half = min(report["steps"], key=lambda s: abs(s["concurrency"] - knee / 2))
rps = half["requests_per_second"] * (knee / 2) / half["concurrency"]
print(",".join(f"{rps * f:.2f}" for f in (0.2, 0.4, 0.6, 0.8, 1.0)))
PY
)
echo "the sidecar in front of vLLM; Poisson traffic through it at $rates req/s ..."
"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" run --config "$WORK/llmslo.yaml" >"$WORK/sidecar.log" 2>&1 &
SIDECAR_PID=$!
for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$((PORT + 2))/metrics" >/dev/null && break; sleep 0.2; done
# One sweep per rate, each followed by a scrape: saturation is read on each step's own minute.
step=0
for rate in ${rates//,/ }; do
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$((PORT + 1))" \
        --model small --config "$WORK/llmslo.yaml" --dataset "$WORK/prompts.jsonl" \
        --output-tokens "$OUTPUT_LEN" --rate "$rate" --duration "$STEP" --warmup 0s \
        --json "$WORK/traffic-$step.json" | tee -a "$WORK/traffic.txt"
    curl -sf "http://127.0.0.1:$((PORT + 2))/metrics" >"$WORK/metrics-$step.txt"
    step=$((step + 1))
done
cp "$WORK/metrics-$((step - 1)).txt" "$WORK/metrics.txt"
cp "$WORK"/sweep.json "$WORK"/traffic-*.json "$WORK"/metrics-*.txt "$ROOT/target/" 2>/dev/null || true

python3 - "$WORK" <<'PY'
import glob, json, re, sys
work = sys.argv[1]
sweep = json.load(open(f"{work}/sweep.json"))
steps = sorted(glob.glob(f"{work}/traffic-*.json"), key=lambda p: int(re.search(r"-(\d+)\.json", p).group(1)))
traffic = [json.load(open(p))["steps"][0] for p in steps]
scrapes = [open(f"{work}/metrics-{i}.txt").read() for i in range(len(steps))]
metrics = scrapes[-1]
def gauge(name, labels="", text=None):
    series = name + ("{" + labels + "}" if labels else "")
    m = re.search("^" + re.escape(series) + r" (\S+)", text or metrics, re.M)
    return float(m.group(1)) if m else float("nan")
knee = sweep["knee"]["concurrency"]
at_knee = next(s for s in sweep["steps"] if s["concurrency"] == knee)
live = gauge("llmslo_capacity_concurrency", 'slo="tpot"')
loads = [s["requests_per_second"] * s["e2e_mean_s"] for s in traffic]
print("\n| | sweep (pushed through the knee) | live estimate (traffic at ≤ 50 % of the knee) | diff |")
print("| --- | --- | --- | --- |")
print(f"| knee concurrency (tpot) | {knee} | {live:.1f} | {100 * (live - knee) / knee:+.0f} % |")
rps = gauge("llmslo_capacity_goodput_requests_per_second")
print(f"| goodput req/s at the knee | {at_knee['goodput_requests_per_second']:.2f} | {rps:.2f} | "
      f"{100 * (rps - at_knee['goodput_requests_per_second']) / at_knee['goodput_requests_per_second']:+.0f} % |")
print(f"\ntraffic: mean concurrency per rate step {', '.join(f'{l:.1f}' for l in loads)} "
      f"({100 * min(loads) / knee:.0f} % to {100 * max(loads) / knee:.0f} % of the knee)")
base = gauge("llmslo_latency_model_tpot_seconds", 'term="base"')
per = gauge("llmslo_latency_model_tpot_seconds", 'term="per_request"')
fit = gauge("llmslo_latency_model_fit_ratio")
print(f"fitted TPOT = {base * 1e3:.1f} ms + {per * 1e3:.2f} ms x in flight (fit ratio {fit:.2f})")
print("\n| Poisson rate | mean in flight | TPOT attainment | live knee | load the SLO met | saturation |")
print("| --- | --- | --- | --- | --- | --- |")
for s, load, text in zip(traffic, loads, scrapes):
    knee_now, met, saturation = (gauge(name, text=text) for name in (
        "llmslo_capacity_knee_concurrency", "llmslo_capacity_load_concurrency", "llmslo_slo_saturation_ratio"))
    print(f"| {s['rate']:.2f} req/s | {load:.1f} | {100 * s['attainment']['tpot']:.1f} % | "
          f"{knee_now:.1f} | {met:.1f} | {saturation:.2f} |")
print("\nsweep TPOT p95 by concurrency: " + ", ".join(
    f"c={s['concurrency']}: {s['tpot_p95_s'] * 1e3:.1f} ms" if "tpot_p95_s" in s else
    f"c={s['concurrency']}: p99 {s['tpot_p99_s'] * 1e3:.1f} ms" for s in sweep["steps"]))
PY
