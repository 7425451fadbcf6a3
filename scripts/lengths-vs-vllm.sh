#!/usr/bin/env bash
# The lengths `llmslo sweep` states, on a real vLLM (CPU, the `small` model of the vLLM-on-CPU
# runner that VLLM_SH names): a synthetic prompt of each of PROMPT_TOKENS tokens on each API,
# against the prompt tokens the engine counted (usage); then a replayed trace on each API, with
# the output lengths asked against those served and the APIs that ended requests early.
#
#   scripts/lengths-vs-vllm.sh                  prompts of 64 and 256 tokens, chat, Responses, Messages
#   PROMPT_TOKENS="32 512" ENDPOINTS=chat scripts/lengths-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}
PROMPT_TOKENS=${PROMPT_TOKENS:-64 256}
ENDPOINTS=${ENDPOINTS:-chat responses messages}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT"
trap 'kill ${ENGINE_PID:-} 2>/dev/null || true' EXIT
start_vllm

cat >"$WORK/slo.yaml" <<'YAML'
slos:
  - name: ttft-5s
    objective: 99
    ttft: 5s
YAML

# A trace of 25 requests over 25 s, each asking 24 to 48 output tokens of a 64-token prompt.
python3 - "$WORK/trace.jsonl" <<'PY'
import json, random, sys
rng = random.Random(1)
with open(sys.argv[1], "w") as out:
    for i in range(25):
        out.write(json.dumps({"timestamp": i * 1000, "input_length": 64, "output_length": rng.randint(24, 48)}) + "\n")
PY

sweep() {
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" sweep --target "http://127.0.0.1:$PORT" --model small \
        --config "$WORK/slo.yaml" "$@"
}
for endpoint in $ENDPOINTS; do
    for tokens in $PROMPT_TOKENS; do
        echo "$endpoint: a synthetic prompt of $tokens tokens, 2 clients, 20 s ..."
        sweep --endpoint "$endpoint" --concurrency 2 --warmup 2s --duration 20s --prompt-tokens "$tokens" \
            --output-tokens 16 --json "$WORK/synthetic-$endpoint-$tokens.json" >"$WORK/synthetic-$endpoint-$tokens.txt" 2>&1
        grep '^llmslo sweep: prompts' "$WORK/synthetic-$endpoint-$tokens.txt" || true
    done
    echo "$endpoint: the trace replayed at its own rate ..."
    sweep --endpoint "$endpoint" --replay "$WORK/trace.jsonl" --rate-scale 1 \
        --json "$WORK/replay-$endpoint.json" >"$WORK/replay-$endpoint.txt" 2>&1
done

python3 - "$WORK" "$PROMPT_TOKENS" $ENDPOINTS <<'PY'
import json, sys
work, lengths, endpoints = sys.argv[1], [int(t) for t in sys.argv[2].split()], sys.argv[3:]
trace = [json.loads(line) for line in open(f"{work}/trace.jsonl")]
trace_mean = sum(r["output_length"] for r in trace) / len(trace)
print(f"\n| API | prompt tokens asked | the engine's count, mean | difference |")
print("| --- | --- | --- | --- |")
for api in endpoints:
    for asked in lengths:
        got = json.load(open(f"{work}/synthetic-{api}-{asked}.json"))["steps"][0]["prompt_tokens_mean"]
        print(f"| {api} | {asked} | {got:.1f} | {100 * (got - asked) / asked:+.1f} % |")
print(f"\n| API | replay: output tokens asked / served, mean | ended early |")
print("| --- | --- | --- |")
for api in endpoints:
    replay = json.load(open(f"{work}/replay-{api}.json"))["steps"][0]
    early = replay.get("ended_early", {}).get(api, {"ended_early": 0, "served": 0})
    print(f"| {api} | {trace_mean:.1f} / {replay['output_tokens_mean']:.1f} | {early['ended_early']} of {early['served']} |")
PY
for api in $ENDPOINTS; do
    echo; echo "== llmslo sweep's report of the $api replay =="; cat "$WORK/replay-$api.txt"
done
