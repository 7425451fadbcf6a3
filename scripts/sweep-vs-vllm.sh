#!/usr/bin/env bash
# `llmslo sweep` against vLLM's own client benchmark (`vllm bench serve`) on a real vLLM (CPU,
# the `small` model of the vLLM-on-CPU runner that VLLM_SH names): at each concurrency, both send the
# same prompts (one JSONL file of distinct prompts) to the chat endpoint for the same number
# of output tokens; the script prints their mean TTFT and TPOT side by side, and the sweep's
# table and plot (target/sweep-vllm.svg). Prefix caching is off, so that whichever tool runs
# second does not find the other's prompts cached.
#
#   scripts/sweep-vs-vllm.sh                        concurrency 1 and 4, three rounds each
#   CONCURRENCY="1 4 8" INPUT_LEN=128 OUTPUT_LEN=32 ROUNDS=5 scripts/sweep-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}
CONCURRENCY=${CONCURRENCY:-1 4}
INPUT_LEN=${INPUT_LEN:-32}    # words per prompt
OUTPUT_LEN=${OUTPUT_LEN:-32}
NUM_PROMPTS=${NUM_PROMPTS:-30}   # per client, for each vllm bench round
DURATION=${DURATION:-25s}        # each sweep round's window
ROUNDS=${ROUNDS:-3}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

# `vllm bench serve --dataset-name custom` reads the prompts with pandas.
[ -d "$VLLM_DIR/venv" ] || bash "$VLLM_SH" install
"$VLLM_DIR/venv/bin/python" -c 'import pandas' 2>/dev/null || "$VLLM_DIR/venv/bin/python" -m pip install -q pandas
require_free_ports "$PORT"
trap 'kill ${ENGINE_PID:-} 2>/dev/null || true' EXIT
start_vllm

write_prompts "$WORK/prompts.jsonl" 400 "$INPUT_LEN"

cat >"$WORK/slo.yaml" <<'YAML'
slos:
  - name: ttft-1s
    objective: 99
    ttft: 1s
  - name: tpot-100ms
    objective: 99
    tpot: 100ms
goodput:
  require: [ttft-1s, tpot-100ms]
YAML

# The tools take turns, ROUNDS times at each concurrency: a 2-core machine and a CPU engine
# drift by several percent from one minute to the next, and the median of interleaved rounds
# keeps that drift out of the comparison.
for c in $CONCURRENCY; do
    for r in $(seq 1 "$ROUNDS"); do
        echo "concurrency $c, round $r: vllm bench serve, then llmslo sweep ..."
        "${PIN_CLIENT[@]}" bash "$VLLM_SH" bench "http://127.0.0.1:$PORT" small \
            --dataset-name custom --dataset-path "$WORK/prompts.jsonl" --skip-chat-template --disable-shuffle \
            --custom-output-len "$OUTPUT_LEN" --ignore-eos \
            --num-prompts "$((NUM_PROMPTS * c))" --max-concurrency "$c" \
            --save-result --result-dir "$WORK" --result-filename "vllm-$c-$r.json" >"$WORK/vllm-$c-$r.log" 2>&1
        "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$PORT" --model small \
            --config "$WORK/slo.yaml" --concurrency "$c" --dataset "$WORK/prompts.jsonl" \
            --output-tokens "$OUTPUT_LEN" --duration "$DURATION" --warmup 3s --json "$WORK/sweep-$c-$r.json" \
            >/dev/null 2>&1
    done
done
commas=$(echo $CONCURRENCY | tr ' ' ',')
echo "llmslo sweep at concurrency $commas, for the table and the plot ..."
"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$PORT" --model small \
    --config "$WORK/slo.yaml" --concurrency "$commas" --dataset "$WORK/prompts.jsonl" --output-tokens "$OUTPUT_LEN" \
    --duration "$DURATION" --warmup 3s --plot "$ROOT/target/sweep-vllm.svg" | tee "$WORK/sweep.txt"

python3 - "$WORK" "$ROUNDS" $CONCURRENCY <<'PY'
import json, statistics, sys
work, rounds, levels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
# vllm bench stamps TTFT at the first chunk, even vLLM's role-only chunk that comes before the
# first visible text; the sweep's TTFT is the first visible token and its TTFB the
# first chunk: TTFB is the like-for-like figure, TTFT is shown beside it.
print(f"\nMedians of {rounds} interleaved rounds (each round's mean over its requests)\n")
print("| concurrency | prompt tokens (vllm bench / llmslo sweep) | TTFT vllm bench | TTFB llmslo sweep | diff | llmslo TTFT (first visible token) | TPOT vllm bench | TPOT llmslo sweep | diff |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for c in levels:
    v = [json.load(open(f"{work}/vllm-{c}-{r}.json")) for r in range(1, rounds + 1)]
    s = [json.load(open(f"{work}/sweep-{c}-{r}.json"))["steps"][0] for r in range(1, rounds + 1)]
    med = statistics.median
    vin = med(x["total_input_tokens"] / x["completed"] for x in v)
    row = [c, f"{vin:.0f} / {med(x['prompt_tokens_mean'] for x in s):.0f}"]
    for vm, sm in [(med(x["mean_ttft_ms"] for x in v), med(x["ttfb_mean_s"] * 1e3 for x in s)),
                   (med(x["mean_tpot_ms"] for x in v), med(x["tpot_mean_s"] * 1e3 for x in s))]:
        row += [f"{vm:.1f} ms", f"{sm:.1f} ms", f"{100 * (sm - vm) / vm:+.1f} %"]
        if len(row) == 5:
            row.append(f"{med(x['ttft_mean_s'] * 1e3 for x in s):.1f} ms")
    print("| " + " | ".join(map(str, row)) + " |")
    for name, vk, sk in [("TTFT/TTFB", "mean_ttft_ms", "ttfb_mean_s"), ("TPOT", "mean_tpot_ms", "tpot_mean_s")]:
        print(f"  c={c} {name} by round: vllm bench " + ", ".join(f"{x[vk]:.1f}" for x in v)
              + " / llmslo sweep " + ", ".join(f"{x[sk] * 1e3:.1f}" for x in s))
PY
