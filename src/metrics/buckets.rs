//! Histogram bucket edges and the constructor that gives each family its own.

use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::MetricConstructor;
use serde::Deserialize;
use std::sync::Arc;

/// Time to first token edges, seconds: vLLM's edges, with more between 50 ms and 5 s so that
/// no step there is wider than 25 % (where TTFT SLOs live, and what `histogram_quantile`
/// interpolates across).
pub const TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5,
    0.6, 0.75, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
    2560.0,
];

/// Time per output token and inter-chunk latency edges, seconds: vLLM's edges, with more
/// between 5 ms and 150 ms so that no step there is wider than 25 % (real TPOTs sit at 15-60 ms).
pub const TPOT: &[f64] = &[
    0.001, 0.0025, 0.005, 0.006, 0.0075, 0.0085, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05,
    0.06, 0.075, 0.09, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];

/// End-to-end request duration edges, seconds.
pub const E2E: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 163.84, 327.68, 655.36,
    1310.72, 2621.44, 5242.88,
];

/// Token usage edges, tokens.
pub const TOKENS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];

/// Tokens per chunk edges.
pub const TOKENS_PER_CHUNK: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0];

/// Per-family bucket overrides from the config file (`buckets:`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct BucketOverrides {
    /// `buckets.ttft`.
    pub ttft: Option<Vec<f64>>,
    /// `buckets.tpot` (also used for inter-chunk latency).
    pub tpot: Option<Vec<f64>>,
    /// `buckets.e2e`.
    pub e2e: Option<Vec<f64>>,
    /// `buckets.tokens`.
    pub tokens: Option<Vec<f64>>,
    /// `buckets.tokens_per_chunk`.
    pub tokens_per_chunk: Option<Vec<f64>>,
}

impl BucketOverrides {
    /// Checks every override; the error names the offending key.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let all = [
            ("ttft", &self.ttft),
            ("tpot", &self.tpot),
            ("e2e", &self.e2e),
            ("tokens", &self.tokens),
            ("tokens_per_chunk", &self.tokens_per_chunk),
        ];
        for (name, edges) in all {
            if let Some(edges) = edges {
                check_edges(edges).map_err(|why| (format!("buckets.{name}"), why))?;
            }
        }
        Ok(())
    }
}

fn check_edges(edges: &[f64]) -> Result<(), String> {
    if edges.is_empty() {
        return Err("must list at least one bucket edge".into());
    }
    if edges.iter().any(|e| !e.is_finite() || *e <= 0.0) {
        return Err("every edge must be a positive, finite number".into());
    }
    if edges.windows(2).any(|w| w[0] >= w[1]) {
        return Err("edges must be strictly increasing".into());
    }
    Ok(())
}

/// A histogram constructor holding one family's bucket edges.
#[derive(Debug, Clone)]
pub struct Buckets(Arc<[f64]>);

impl Buckets {
    /// The configured edges when given, else the defaults, plus `exact` edges (SLO thresholds).
    pub fn new(configured: Option<&Vec<f64>>, default: &[f64], exact: &[f64]) -> Self {
        let mut edges: Vec<f64> = configured.map_or(default, |v| v.as_slice()).to_vec();
        edges.extend_from_slice(exact);
        edges.sort_by(f64::total_cmp);
        edges.dedup();
        Buckets(edges.into())
    }

    /// The edges, ascending.
    pub fn edges(&self) -> &[f64] {
        &self.0
    }
}

impl<S> MetricConstructor<HistogramWithExemplars<S>> for Buckets {
    fn new_metric(&self) -> HistogramWithExemplars<S> {
        HistogramWithExemplars::new(self.0.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket edges of a family in vLLM 0.32's own `/metrics` (a real capture).
    fn vllm_edges(family: &str) -> Vec<f64> {
        let capture = include_str!("../../tests/fixtures/vllm-0.32-metrics.txt");
        let mut edges: Vec<f64> = capture
            .lines()
            .filter(|l| l.starts_with(&format!("{family}_bucket{{")))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
            .filter(|e: &f64| e.is_finite())
            .collect();
        edges.sort_by(f64::total_cmp);
        edges.dedup();
        edges
    }

    /// The widest step between consecutive edges within [from, to], as a ratio.
    fn widest_step(edges: &[f64], from: f64, to: f64) -> f64 {
        edges
            .windows(2)
            .filter(|w| w[0] >= from && w[1] <= to)
            .map(|w| w[1] / w[0])
            .fold(1.0, f64::max)
    }

    #[test]
    fn steps_are_at_most_25_percent_where_slos_live_and_vllms_edges_are_kept() {
        assert!(
            widest_step(TPOT, 0.005, 0.15) <= 1.25 + 1e-9,
            "{}",
            widest_step(TPOT, 0.005, 0.15)
        );
        assert!(
            widest_step(TTFT, 0.05, 5.0) <= 1.25 + 1e-9,
            "{}",
            widest_step(TTFT, 0.05, 5.0)
        );
        for (ours, family) in [
            (TTFT, "vllm:time_to_first_token_seconds"),
            (TPOT, "vllm:inter_token_latency_seconds"),
            (TPOT, "vllm:request_time_per_output_token_seconds"),
        ] {
            let vllm = vllm_edges(family);
            assert!(vllm.len() > 10, "{family} in the capture");
            assert!(
                vllm.iter().all(|e| ours.contains(e)),
                "every edge of {family} is one of ours"
            );
        }
    }

    #[test]
    fn defaults_are_strictly_increasing() {
        for edges in [TTFT, TPOT, E2E, TOKENS, TOKENS_PER_CHUNK] {
            assert!(check_edges(edges).is_ok());
        }
    }

    #[test]
    fn slo_thresholds_become_exact_edges() {
        let b = Buckets::new(None, TPOT, &[0.05, 0.042]);
        assert!(b.0.contains(&0.042));
        assert_eq!(b.0.len(), TPOT.len() + 1, "0.05 was already an edge");
        assert!(b.0.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn bad_overrides_name_their_key() {
        let bad = BucketOverrides {
            tpot: Some(vec![0.1, 0.05]),
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "buckets.tpot");
        let empty = BucketOverrides {
            e2e: Some(vec![]),
            ..Default::default()
        };
        assert_eq!(empty.validate().unwrap_err().0, "buckets.e2e");
        let negative = BucketOverrides {
            ttft: Some(vec![-1.0]),
            ..Default::default()
        };
        assert_eq!(negative.validate().unwrap_err().0, "buckets.ttft");
    }
}
