//! Capacity per pool of a disaggregated deployment: each pod's live knee is judged by the SLOs
//! of its phase (a prefill pod's by TTFT, in prefill legs per second; a decode pod's by TPOT,
//! in streams per second), and each pod exports its role; these rules add the pods of one
//! pool (one job and role: every target label but `instance` and `pod`) up. An aggregated
//! deployment is one pool, role `aggregated`.

use super::{record, Group};

/// The series of a pod, with its role: `<series> * on(instance) group_left(role) llmslo_role`.
fn with_role(series: &str) -> String {
    format!("{series} * on (instance) group_left (role) llmslo_role")
}

/// The pool rules: load, replicas, knee, capacity, replicas needed and saturation per pool.
pub(super) fn pool_group() -> Group {
    Group {
        name: "llmslo-pools".into(),
        rules: vec![
            record(
                "llmslo:pool_load_requests_per_second:sum",
                &format!(
                    "sum without (instance, pod) ({})",
                    with_role("llmslo_capacity_load_requests_per_second")
                ),
            ),
            record(
                "llmslo:pool_replicas:count",
                "count without (instance, pod) (llmslo_role)",
            ),
            // `x > 0` keeps the pods whose knee is known, as the fleet capacity rules do.
            record(
                "llmslo:pool_knee_requests_per_second:avg",
                &format!(
                    "avg without (instance, pod) ({})",
                    with_role("(llmslo_capacity_knee_requests_per_second > 0)")
                ),
            ),
            record(
                "llmslo:pool_capacity_requests_per_second:sum",
                "llmslo:pool_knee_requests_per_second:avg * llmslo:pool_replicas:count",
            ),
            record(
                "llmslo:pool_replicas_needed:ceil",
                "ceil(llmslo:pool_load_requests_per_second:sum / llmslo:pool_knee_requests_per_second:avg)",
            ),
            record(
                "llmslo:pool_saturation:ratio",
                "llmslo:pool_load_requests_per_second:sum / llmslo:pool_capacity_requests_per_second:sum",
            ),
        ],
    }
}
