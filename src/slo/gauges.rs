//! The SLO gauges, computed from the windows when Prometheus scrapes: error ratio and burn
//! rate per window, the error budget left, goodput and attainment, and how much of each
//! window the sidecar has seen.

use super::{ServiceModelLabels, SloEngine, SloLabels};
use crate::record::LabelText;
use crate::tenant::TenantLabel;
use crate::window::WINDOWS;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, EncodeLabelSet)]
struct SloWindowLabels {
    slo_service: LabelText,
    slo: LabelText,
    model: LabelText,
    #[prometheus(flatten)]
    tenant: TenantLabel,
    window: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct ServiceModelWindowLabels {
    slo_service: LabelText,
    model: LabelText,
    #[prometheus(flatten)]
    tenant: TenantLabel,
    window: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct WindowLabel {
    window: &'static str,
}

impl SloEngine {
    /// Every gauge value at `now`, for the collector and for tests.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let set = self.set();
        let uptime = now.saturating_duration_since(self.started);
        let mut state = self.state.lock().expect("slo state lock");
        let mut snapshot = Snapshot {
            coverage: WINDOWS
                .map(|(name, length)| (name, ratio_of(uptime.min(length), length)))
                .to_vec(),
            ..Snapshot::default()
        };
        // Per tenant only when asked: otherwise each model's gauges sum its tenants' windows.
        let gauge_labels = |tenant: &TenantLabel| {
            if self.tenant_gauges {
                tenant.clone()
            } else {
                TenantLabel(None)
            }
        };
        let mut slos: BTreeMap<SloLabels, ([[u64; 2]; 7], [u64; 2])> = BTreeMap::new();
        for (labels, windows) in &mut state.slos {
            let key = SloLabels {
                tenant: gauge_labels(&labels.tenant),
                ..labels.clone()
            };
            let (sums, period) = slos.entry(key).or_insert(([[0; 2]; 7], [0; 2]));
            add(sums, windows.sums(now));
            add(std::slice::from_mut(period), [windows.period_sum(now)]);
        }
        for (labels, (sums, [events, bad])) in slos {
            let Some(slo) = set.slos.iter().find(|s| s.name == labels.slo) else {
                continue;
            };
            for ((name, _), [events, bad]) in WINDOWS.iter().zip(sums) {
                let ratio = if events < set.min_events {
                    f64::NAN
                } else {
                    bad as f64 / events as f64
                };
                snapshot.error_ratio.push((labels.clone(), name, ratio));
                snapshot
                    .burn_rate
                    .push((labels.clone(), name, ratio / slo.error_budget()));
            }
            let spent = if events == 0 {
                0.0
            } else {
                bad as f64 / events as f64 / slo.error_budget()
            };
            snapshot.budget_remaining.push((labels, 1.0 - spent));
        }
        // Nothing judges goodput without SLOs: every goodput gauge is NaN.
        let judging = set.judges_goodput();
        let mut goodput: BTreeMap<ServiceModelLabels, [[u64; 3]; 7]> = BTreeMap::new();
        for (labels, windows) in &mut state.goodput {
            let key = ServiceModelLabels {
                tenant: gauge_labels(&labels.tenant),
                ..labels.clone()
            };
            add(goodput.entry(key).or_insert([[0; 3]; 7]), windows.sums(now));
        }
        for (labels, sums) in goodput {
            for ((name, length), [judged, good, tokens]) in WINDOWS.iter().zip(sums) {
                let seconds = uptime.min(*length).as_secs_f64().max(1e-9);
                let per_second = |n: u64| if judging { n as f64 / seconds } else { f64::NAN };
                snapshot.goodput_rps.push((labels.clone(), name, per_second(good)));
                snapshot.goodput_tps.push((labels.clone(), name, per_second(tokens)));
                let attainment = if judged == 0 {
                    f64::NAN
                } else {
                    good as f64 / judged as f64
                };
                snapshot.attainment.push((labels.clone(), name, attainment));
            }
        }
        snapshot
    }
}

/// Adds each window's counts of `more` to `into`'s.
fn add<const N: usize>(into: &mut [[u64; N]], more: impl IntoIterator<Item = [u64; N]>) {
    for (sum, counts) in into.iter_mut().zip(more) {
        for (a, b) in sum.iter_mut().zip(counts) {
            *a += b;
        }
    }
}

fn ratio_of(part: Duration, whole: Duration) -> f64 {
    part.as_secs_f64() / whole.as_secs_f64()
}

/// The SLO gauges at one instant.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    /// `llmslo_slo_error_ratio` by SLO, model and window.
    pub error_ratio: Vec<(SloLabels, &'static str, f64)>,
    /// `llmslo_slo_burn_rate` by SLO, model and window.
    pub burn_rate: Vec<(SloLabels, &'static str, f64)>,
    /// `llmslo_slo_error_budget_remaining_ratio` by SLO and model.
    pub budget_remaining: Vec<(SloLabels, f64)>,
    /// `llmslo_slo_window_coverage_ratio` by window.
    pub coverage: Vec<(&'static str, f64)>,
    /// `llmslo_goodput_requests_per_second` by service, model and window (NaN without
    /// goodput.require).
    pub goodput_rps: Vec<(ServiceModelLabels, &'static str, f64)>,
    /// `llmslo_goodput_output_tokens_per_second` by service, model and window.
    pub goodput_tps: Vec<(ServiceModelLabels, &'static str, f64)>,
    /// `llmslo_slo_attainment_ratio` by service, model and window (NaN with nothing judged).
    pub attainment: Vec<(ServiceModelLabels, &'static str, f64)>,
}

/// Encodes the gauges at scrape time; it only reads the windows.
#[derive(Debug)]
pub(super) struct SloCollector(pub(super) Arc<SloEngine>);

impl Collector for SloCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.snapshot(Instant::now());
        let gauge = MetricType::Gauge;
        for (name, help, values) in [
            (
                "llmslo_slo_error_ratio",
                "Bad over valid events in the window (NaN below min_events)",
                &s.error_ratio,
            ),
            (
                "llmslo_slo_burn_rate",
                "Error ratio over the error budget (1 - objective); NaN below min_events",
                &s.burn_rate,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, gauge)?;
            for (l, window, v) in values {
                let labels = SloWindowLabels {
                    slo_service: l.slo_service.clone(),
                    slo: l.slo.clone(),
                    model: l.model.clone(),
                    tenant: l.tenant.clone(),
                    window,
                };
                ConstGauge::new(*v).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_slo_error_budget_remaining_ratio",
            "Share of the error budget left over min(uptime, period)",
            None,
            gauge,
        )?;
        for (l, v) in &s.budget_remaining {
            ConstGauge::new(*v).encode(family.encode_family(l)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_slo_window_coverage_ratio",
            "How much of each window this process has been up for",
            None,
            gauge,
        )?;
        for (window, v) in &s.coverage {
            ConstGauge::new(*v).encode(family.encode_family(&WindowLabel { window })?)?;
        }
        for (name, help, values) in [
            (
                "llmslo_goodput_requests_per_second",
                "Goodput: successful requests that met every goodput.require SLO, per second of the window",
                &s.goodput_rps,
            ),
            (
                "llmslo_goodput_output_tokens_per_second",
                "Output tokens of goodput requests per second of the window",
                &s.goodput_tps,
            ),
            (
                "llmslo_slo_attainment_ratio",
                "Goodput requests over valid requests in the window",
                &s.attainment,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, gauge)?;
            for (l, window, v) in values {
                let labels = ServiceModelWindowLabels {
                    slo_service: l.slo_service.clone(),
                    model: l.model.clone(),
                    tenant: l.tenant.clone(),
                    window,
                };
                ConstGauge::new(*v).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
