#!/bin/sh
# Builds target/release/llmslo with profile-guided optimisation, as the image ships it.
#
# An instrumented build proxies a short streaming load (the built-in simulated engine, and
# `llmslo sweep` through `llmslo run` on the chat, completions, Responses and Messages APIs,
# up to a thousand streams); the release build is then laid out and inlined by the profile
# the proxy wrote. Only the proxy's profile is kept: the engine and the clients run from the
# same binary but write theirs elsewhere.
#
#   scripts/pgo-build.sh [--instrument-only] [CARGO ARGUMENTS]
#
# --instrument-only stops after the instrumented build (the image builds its dependencies so,
# in a layer of their own). Other arguments, such as --locked, go to both cargo builds, and
# RUSTFLAGS, if set, to both compilers. It needs rustup's llvm-tools component, for
# llvm-profdata (`rustup component add llvm-tools`). The load binds free ports on 127.0.0.1;
# PGO_ENGINE_LISTEN, PGO_PROXY_LISTEN and PGO_METRICS_LISTEN (HOST:PORT) choose them.
set -eu
cd "$(dirname "$0")/.."
instrument_only=false
if [ "${1:-}" = "--instrument-only" ]; then
    instrument_only=true
    shift
fi
work=$PWD/target/pgo
instrumented=$work/instrumented/release/llmslo

RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$work/profiles" cargo build --release "$@" --target-dir "$work/instrumented"
$instrument_only && exit 0

host=$(rustc -vV | sed -n 's/^host: //p')
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
if [ ! -x "$profdata" ]; then
    echo "pgo-build: $profdata is missing: rustup component add llvm-tools" >&2
    exit 1
fi
rm -rf "$work/profiles" "$work/others" "$work/run"
mkdir -p "$work/run"

# The SLOs of `llmslo bench`: every request is judged as it is in production.
cat > "$work/run/llmslo.yaml" <<'EOF'
engine: vllm
service: pgo
slos:
  - {name: ttft-500ms, objective: 99, ttft: 500ms}
  - {name: tpot-50ms, objective: 99, tpot: 50ms}
  - {name: availability, objective: 99.9, availability: true}
goodput: {require: [ttft-500ms, tpot-50ms]}
gpu: {enabled: false}
final_scrape_grace: 0s
# The load comes from one address, as through a gateway.
max_in_flight_per_client: 1024
EOF

# Waits for a started process's log (text, as both are started with) to name its address, and
# prints it.
address_in() {
    for _ in $(seq 600); do
        address=$(sed -n "s/.*$2=\([0-9.:]*\).*/\1/p" "$1" | head -n 1)
        [ -n "$address" ] && { echo "$address"; return 0; }
        sleep 0.1
    done
    echo "pgo-build: nothing listening after 60 s; its log, $1:" >&2
    cat "$1" >&2
    return 1
}

LLVM_PROFILE_FILE="$work/others/%p.profraw" "$instrumented" simulate --listen "${PGO_ENGINE_LISTEN:-127.0.0.1:0}" \
    --ttft 50ms --tpot 10ms --max-tokens 64 --log info --log-format text > "$work/run/simulate.log" 2>&1 &
engine_pid=$!
proxy_pid=""
trap 'kill $engine_pid $proxy_pid 2>/dev/null || true' EXIT
engine=$(address_in "$work/run/simulate.log" listen)
"$instrumented" run --config "$work/run/llmslo.yaml" --upstream "http://$engine" \
    --listen "${PGO_PROXY_LISTEN:-127.0.0.1:0}" --metrics-listen "${PGO_METRICS_LISTEN:-127.0.0.1:0}" --log info --log-format text > "$work/run/run.log" 2>&1 &
proxy_pid=$!
proxy=$(address_in "$work/run/run.log" proxy_addr)

sweep() {
    LLVM_PROFILE_FILE="$work/others/%p.profraw" "$instrumented" sweep --config "$work/run/llmslo.yaml" \
        --target "http://$proxy" --output-tokens 64 --warmup 0s "$@" > /dev/null
}
for endpoint in completions responses messages; do
    sweep --endpoint "$endpoint" --concurrency 20 --duration 2s
done
sweep --endpoint chat --concurrency 100,1000 --duration 5s

# The proxy writes its profile as it exits.
kill -TERM "$proxy_pid"
wait "$proxy_pid"
proxy_pid=""
"$profdata" merge -o "$work/llmslo.profdata" "$work/profiles"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$work/llmslo.profdata" cargo build --release "$@"
echo "pgo-build: target/release/llmslo, optimised with the profile $work/llmslo.profdata"
