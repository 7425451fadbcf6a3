#!/usr/bin/env bash
# `llmslo sweep` against vLLM's own client benchmark (`vllm bench serve`) on a real vLLM (CPU,
# the `small` model of ../shared/real-engines/vllm-cpu): at each concurrency, both send the
# same prompts (one JSONL file of distinct prompts) to the chat endpoint for the same number
# of output tokens; the script prints their mean TTFT and TPOT side by side, and the sweep's
# table and plot (target/sweep-vllm.svg). Prefix caching is off, so that whichever tool runs
# second does not find the other's prompts cached.
#
#   scripts/sweep-vs-vllm.sh                        concurrency 1 and 4
#   CONCURRENCY="1 4 8" INPUT_LEN=128 OUTPUT_LEN=32 scripts/sweep-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VLLM_SH=${VLLM_SH:-$ROOT/../shared/real-engines/vllm-cpu/vllm-cpu.sh}
export VLLM_DIR=${VLLM_DIR:-$ROOT/.vllm-cpu}
PORT=${PORT:-18000}
CONCURRENCY=${CONCURRENCY:-1 4}
INPUT_LEN=${INPUT_LEN:-128}   # words per prompt
OUTPUT_LEN=${OUTPUT_LEN:-32}
NUM_PROMPTS=${NUM_PROMPTS:-40}
DURATION=${DURATION:-60s}
WORK=$(mktemp -d)
# The engine gets core 0, the clients the rest (vLLM's CPU backend keeps its cores busy).
PIN_ENGINE=() PIN_CLIENT=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    export VLLM_CPU_OMP_THREADS_BIND=0
    PIN_ENGINE=(taskset -c 0) PIN_CLIENT=(taskset -c "1-$(($(nproc) - 1))")
fi

[ -d "$VLLM_DIR/venv" ] || bash "$VLLM_SH" install
[ -d "$VLLM_DIR/small" ] || bash "$VLLM_SH" model small
# `vllm bench serve --dataset-name custom` reads the prompts with pandas.
"$VLLM_DIR/venv/bin/python" -c 'import pandas' 2>/dev/null || "$VLLM_DIR/venv/bin/python" -m pip install -q pandas
(cd "$ROOT" && cargo build --release --quiet)
if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then
    echo "something already answers on 127.0.0.1:$PORT: stop it or set PORT" >&2
    exit 1
fi
echo "starting vLLM (small) on 127.0.0.1:$PORT ..."
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
"${PIN_ENGINE[@]}" "$VLLM_DIR/venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$VLLM_DIR/small" \
    --served-model-name small --host 127.0.0.1 --port "$PORT" --dtype float32 --max-model-len 1024 \
    --no-enable-prefix-caching >"$WORK/vllm.log" 2>&1 &
ENGINE_PID=$!
trap 'kill $ENGINE_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 2; done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -30 "$WORK/vllm.log"; exit 1; }

python3 - "$WORK/prompts.jsonl" "$NUM_PROMPTS" "$INPUT_LEN" <<'PY'
import json, random, sys
path, count, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocabulary = "the cat sat red box sun map dog big car hot tea new day old way".split()
rng = random.Random(0)
with open(path, "w") as out:
    for _ in range(count):
        out.write(json.dumps({"prompt": " ".join(rng.choice(vocabulary) for _ in range(words))}) + "\n")
PY

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

for c in $CONCURRENCY; do
    echo "vllm bench serve at concurrency $c ..."
    "${PIN_CLIENT[@]}" bash "$VLLM_SH" bench "http://127.0.0.1:$PORT" small \
        --dataset-name custom --dataset-path "$WORK/prompts.jsonl" --skip-chat-template --disable-shuffle \
        --custom-output-len "$OUTPUT_LEN" --ignore-eos \
        --num-prompts "$NUM_PROMPTS" --max-concurrency "$c" \
        --save-result --result-dir "$WORK" --result-filename "vllm-$c.json" >"$WORK/vllm-$c.log" 2>&1
done
commas=$(echo $CONCURRENCY | tr ' ' ',')
echo "llmslo sweep at concurrency $commas ..."
"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$PORT" --model small \
    --config "$WORK/slo.yaml" --concurrency "$commas" --dataset "$WORK/prompts.jsonl" --output-tokens "$OUTPUT_LEN" \
    --duration "$DURATION" --warmup 5s --json "$WORK/sweep.json" --plot "$ROOT/target/sweep-vllm.svg" | tee "$WORK/sweep.txt"

python3 - "$WORK" $CONCURRENCY <<'PY'
import json, sys
work, levels = sys.argv[1], sys.argv[2:]
sweep = {s["concurrency"]: s for s in json.load(open(f"{work}/sweep.json"))["steps"]}
# vllm bench stamps TTFT at the first chunk, even vLLM's role-only chunk that comes before the
# first visible text; the sweep's TTFT is the first visible token (DESIGN §2) and its TTFB the
# first chunk: TTFB is the like-for-like figure, TTFT is shown beside it.
print("\n| concurrency | prompt tokens (vllm bench / llmslo sweep) | mean TTFT vllm bench | mean TTFB llmslo sweep | diff | llmslo TTFT (first visible token) | mean TPOT vllm bench | mean TPOT llmslo sweep | diff |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for c in levels:
    v = json.load(open(f"{work}/vllm-{c}.json"))
    s = sweep[int(c)]
    vin = v["total_input_tokens"] / v["completed"]
    row = [c, f"{vin:.0f} / {s['prompt_tokens_mean']:.0f}"]
    for vm, sm in [(v["mean_ttft_ms"], s["ttfb_mean_s"] * 1e3), (v["mean_tpot_ms"], s["tpot_mean_s"] * 1e3)]:
        row += [f"{vm:.1f} ms", f"{sm:.1f} ms", f"{100 * (sm - vm) / vm:+.1f} %"]
        if len(row) == 5:
            row.append(f"{s['ttft_mean_s'] * 1e3:.1f} ms")
    print("| " + " | ".join(map(str, row)) + " |")
PY
