#!/usr/bin/env bash
# What the SLO rules cost one Prometheus at fleet size: K pods' SLO counters over three days
# (one sample a minute) are written into a fresh Prometheus (promtool tsdb create-blocks-from),
# the recorded rates the rules build their windows from are backfilled the same way, and the
# rule file is evaluated every 30 s: the script prints the head series, the server's RSS and the
# evaluation time of each rule group, as Prometheus measures them, for each rule file given.
#
#   scripts/fleet-bench.sh K RULES...       e.g. scripts/fleet-bench.sh 200 before.rules.yaml examples/llmslo.rules.yaml
#
# Needs prometheus, promtool and python3. Outside CI: it takes minutes and a few GB of disk.
set -euo pipefail
pods=${1:?usage: fleet-bench.sh K RULES...}
shift
work=$(mktemp -d "${TMPDIR:-/tmp}/llmslo-fleet-XXXXXX")
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
port=$((20000 + RANDOM % 20000))
now=$(date +%s)
start=$((now - 3 * 86400))

echo "== $pods pods, 4 SLOs each, three days of counters"
python3 - "$pods" "$start" "$now" > "$work/counters.om" <<'PY'
import sys
pods, start, end = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
slos = ["ttft-500ms", "tpot-50ms", "answer-2s", "availability"]
for family in ("llmslo_slo_events", "llmslo_slo_bad_events"):
    print(f"# TYPE {family} counter")
    for pod in range(pods):
        for i, slo in enumerate(slos):
            labels = (f'slo_service="chat",slo="{slo}",model="m",namespace="ns-{pod % 10}",'
                      f'pod="pod-{pod}",instance="10.0.{pod // 250}.{pod % 250}:9464",job="llmslo"')
            value = 0.0
            rate = 60.0 if family == "llmslo_slo_events" else 0.3 + 0.1 * ((pod + i) % 5)
            out = []
            for t in range(start, end, 60):
                value += rate
                out.append(f"{family}_total{{{labels}}} {value} {t}")
            print("\n".join(out))
print("# EOF")
PY
mkdir -p "$work/data"
promtool tsdb create-blocks-from openmetrics "$work/counters.om" "$work/data" > /dev/null
rm "$work/counters.om"

serve() { # serve RULES: a Prometheus on the data, evaluating RULES every 30 s
    printf 'global: {evaluation_interval: 30s}\nrule_files: [%s]\n' "$1" > "$work/prometheus.yaml"
    prometheus --config.file="$work/prometheus.yaml" --storage.tsdb.path="$work/data" \
        --storage.tsdb.retention.time=30d --web.listen-address="127.0.0.1:$port" > "$work/log" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$port/-/ready" > /dev/null; do sleep 1; done
}
stop() { kill "$server"; wait "$server" 2>/dev/null || true; }

# The recorded rates the rules read, backfilled over the three days (two passes: the hourly
# rates read the 5-minute ones, and promtool backfills no rule from another of the same run).
for pass in 'rate5m$' 'rate1h$'; do
    for rules in "$@"; do
        python3 - "$rules" "$pass" > "$work/backfill.yaml" <<'PY'
import re, sys, yaml
keep = re.compile(sys.argv[2])
groups = []
for group in yaml.safe_load(open(sys.argv[1]))["groups"]:
    rules = [r for r in group["rules"] if "record" in r and keep.search(r["record"]) and re.match(r"llmslo:slo_(bad_)?events:", r["record"])]
    if rules:
        groups.append({"name": group["name"], "rules": rules})
yaml.safe_dump({"groups": groups}, sys.stdout)
PY
        grep -q record "$work/backfill.yaml" || continue
        serve /dev/null
        promtool tsdb create-blocks-from rules --quiet --url="http://127.0.0.1:$port" \
            --start="$start" --end="$now" --eval-interval=60s --output-dir="$work/data" "$work/backfill.yaml" > /dev/null
        stop
    done
done

for rules in "$@"; do
    cp "$rules" "$work/rules.yaml"
    serve "$work/rules.yaml"
    sleep 100 # three evaluations
    echo "== $rules"
    curl -sf "http://127.0.0.1:$port/metrics" > "$work/self.txt"
    echo "head series: $(awk '/^prometheus_tsdb_head_series / {print $2}' "$work/self.txt")"
    echo "RSS MiB: $(( $(awk '/VmRSS/ {print $2}' "/proc/$server/status") / 1024 ))"
    python3 - "$work/self.txt" <<'PY'
import re, sys
rows = []
for line in open(sys.argv[1]):
    match = re.match(r'prometheus_rule_group_last_duration_seconds\{rule_group="[^;]*;([^"]*)"\} (\S+)', line)
    if match:
        rows.append((match.group(1), float(match.group(2)) * 1e3))
for group, ms in sorted(rows):
    print(f"  {group:60s} {ms:9.1f} ms")
print(f"  {'all groups':60s} {sum(ms for _, ms in rows):9.1f} ms")
PY
    stop
done
