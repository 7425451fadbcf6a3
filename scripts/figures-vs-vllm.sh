#!/usr/bin/env bash
# What llmslo states against what its clients saw and the engine said, on a real vLLM (CPU, the
# `small` model of the vLLM-on-CPU runner that VLLM_SH names, with --enable-per-request-metrics)
# — not part of CI. First, per API, sequential requests whose TTFT llmslo must match the
# raw-socket client's within 1 ms (scripts/raw_client.py). Then scripts/figures_client.py: 8
# clients at once, sampled requests on chat, Responses and Messages for three tenants, and
# beside the clients' own figures: each tenant's requests, tokens, SLO events, burn rates,
# budgets and cost shares, the cost of a million tokens, /workload's arrivals and lengths, and
# each request's TTFT and TPOT (with how llmslo knew it) against the client's and the engine's.
#
#   scripts/figures-vs-vllm.sh                      8 clients, 20 requests each
#   CLIENTS=8 PER_CLIENT=20 SEQUENTIAL=20 scripts/figures-vs-vllm.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-18000}          # vLLM; the sidecar takes PORT+1 (proxy) and PORT+2 (metrics)
CLIENTS=${CLIENTS:-8}
PER_CLIENT=${PER_CLIENT:-20}
SEQUENTIAL=${SEQUENTIAL:-10}
WORK=$(mktemp -d)
. "$ROOT/scripts/vllm-engine.sh"

require_free_ports "$PORT" "$((PORT + 1))" "$((PORT + 2))"
trap 'kill ${ENGINE_PID:-} ${SIDECAR_PID:-} 2>/dev/null || true' EXIT
VLLM_EXTRA_ARGS="--enable-per-request-metrics ${VLLM_EXTRA_ARGS:-}" start_vllm

# The SLOs and the cost are the ones scripts/figures_client.py judges by.
write_sidecar_config <<'YAML'
min_events: 1
final_scrape_grace: 0s   # the script stops it at once
slos:
  - {name: ttft-1s, objective: 90, ttft: 1s}
  - {name: tpot-40ms, objective: 90, tpot: 40ms}
tenants:
  from:
    - header: x-tenant
  names: [alpha, beta, gamma]
  max_tenants: 0
  gauges: true
cost:
  gpu_hour_price: 4.0
  gpus: 1
  input_token_weight: 0.1
workload:
  recent_requests: 10000
YAML
export LLMSLO_LOG=llmslo=debug LLMSLO_LOG_FORMAT=json
start_sidecar llmslo.log
curl -sf "http://127.0.0.1:$((PORT + 2))/metrics" >/dev/null || { cat "$WORK/llmslo.log"; exit 1; }

ok=0
for api in chat responses messages; do
    "${PIN_CLIENT[@]}" python3 "$ROOT/scripts/raw_client.py" ttft "127.0.0.1:$((PORT + 1))" "$WORK/llmslo.log" \
        small "$SEQUENTIAL" "$api" || ok=1
done
"${PIN_CLIENT[@]}" python3 "$ROOT/scripts/figures_client.py" "127.0.0.1:$((PORT + 1))" "127.0.0.1:$((PORT + 2))" \
    "$WORK/llmslo.log" small "$CLIENTS" "$PER_CLIENT" || ok=1
exit $ok
