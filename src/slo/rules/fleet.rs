//! The fleet-wide groups, the same for every service: goodput, capacity, the sidecars' own
//! health and the GPUs' efficiency.

use super::*;

pub(super) fn goodput_group(set: &SloSet) -> Group {
    let by = fleet_and(set, ["slo_service", "model"]);
    Group {
        name: "llmslo-goodput".into(),
        rules: vec![
            record(
                "llmslo:goodput_requests:rate5m",
                &format!("sum by ({by}) (rate(llmslo_goodput_requests_total[5m]))"),
            ),
            record(
                "llmslo:goodput_output_tokens:rate5m",
                &format!("sum by ({by}) (rate(llmslo_goodput_output_tokens_total[5m]))"),
            ),
            // NaN (0/0) where nothing is judged: no traffic, or no goodput.require.
            record(
                "llmslo:slo_attainment:ratio_rate5m",
                &format!(
                    "sum by ({by}) (rate(llmslo_goodput_requests_total[5m]))\n  \
                     / sum by ({by}) (rate(llmslo_goodput_judged_requests_total[5m]))"
                ),
            ),
        ],
    }
}

/// Fleet capacity from each pod's live estimate of its engine, in request rates (what the
/// load is offered in): the load, the capacity, and how many replicas the load needs, over the
/// pods of one job (every target label but `instance` and `pod`). Pods whose knee is unknown
/// (NaN) carry load but are assumed to be like the pods whose knee is known.
pub(super) fn capacity_group() -> Group {
    Group {
        name: "llmslo-capacity".into(),
        rules: vec![
            record(
                "llmslo:capacity_load_requests_per_second:sum",
                "sum without (instance, pod) (llmslo_capacity_load_requests_per_second)",
            ),
            record(
                "llmslo:capacity_replicas:count",
                "count without (instance, pod) (llmslo_capacity_load_requests_per_second)",
            ),
            // `x > 0` keeps the pods whose knee is a number (NaN compares false) and leaves out
            // one whose SLOs fail at any load (more of it would not help).
            record(
                "llmslo:capacity_knee_requests_per_second:avg",
                "avg without (instance, pod) (llmslo_capacity_knee_requests_per_second > 0)",
            ),
            record(
                "llmslo:capacity_requests_per_second:sum",
                "llmslo:capacity_knee_requests_per_second:avg * llmslo:capacity_replicas:count",
            ),
            record(
                "llmslo:capacity_replicas_needed:ceil",
                "ceil(llmslo:capacity_load_requests_per_second:sum / llmslo:capacity_knee_requests_per_second:avg)",
            ),
            record(
                "llmslo:slo_saturation:ratio",
                "llmslo:capacity_load_requests_per_second:sum / llmslo:capacity_requests_per_second:sum",
            ),
        ],
    }
}

/// The sidecar's own health: a config file it could not use (it forwards on without it, so
/// nothing else would show it) and work it refused at its own limits.
pub(super) fn sidecar_group(set: &SloSet) -> Group {
    let pod = fleet_and(set, ["pod"]);
    let alert = |name: &str, expr: &str, summary: &str, description: &str| Rule {
        alert: Some(name.into()),
        expr: expr.into(),
        for_: Some("5m".into()),
        labels: BTreeMap::from([("severity".into(), "ticket".into())]),
        annotations: BTreeMap::from([
            ("summary".into(), summary.into()),
            ("description".into(), description.into()),
        ]),
        ..Rule::default()
    };
    Group {
        name: "llmslo-sidecar".into(),
        rules: vec![
            alert(
                "LLMSLOConfigInvalid",
                &format!("max by ({pod}) (llmslo_config_valid == 0)"),
                "llmslo in {{ $labels.namespace }}/{{ $labels.pod }} cannot use its config file",
                "The sidecar forwards without the file (no SLOs, default limits), or with the last good \
                 one after a bad reload. Its log names the key and line; `llmslo check-config` does too.",
            ),
            alert(
                "LLMSLORequestsRefused",
                &format!("sum by ({pod}, reason) (rate(llmslo_requests_refused_total[5m])) > 0"),
                "llmslo in {{ $labels.namespace }}/{{ $labels.pod }} refuses work: {{ $labels.reason }}",
                "Clients get 503 at one of the sidecar's own limits (never counted against the engine): \
                 raise the limit named by `reason` with the memory limit, or add replicas.",
            ),
        ],
    }
}

/// Energy and throughput per GPU, by pod: joules per output token next to TPOT.
pub(super) fn gpu_efficiency_group(set: &SloSet) -> Group {
    let pod = fleet_and(set, ["pod"]);
    Group {
        name: "llmslo-gpu-efficiency".into(),
        rules: vec![
            record(
                "llmslo:gpu_energy_joules_per_output_token:rate5m",
                &format!(
                    "sum by ({pod}) (rate(llmslo_gpu_energy_joules_total[5m]))\n  \
                     / sum by ({pod}) (rate(llmslo_output_tokens_total[5m]))"
                ),
            ),
            record(
                "llmslo:output_tokens_per_gpu_second:rate5m",
                &format!(
                    "sum by ({pod}) (rate(llmslo_output_tokens_total[5m]))\n  \
                     / count by ({pod}) (llmslo_gpu_memory_total_bytes)"
                ),
            ),
        ],
    }
}
