//! Live SLO capacity of the engine: each request carries the load it ran under, counted on the
//! whole engine (every model, adapter and API: the engine is what saturates); a bounded window
//! of recent requests is fitted against that load at scrape time, and the fit says how much
//! load the pod can take before each SLO breaks, and how close it is now.

pub mod fit;
pub mod headroom;
pub mod meter;
pub mod model;
pub mod window;

use crate::record::{LegPhase, Outcome, Reader, RequestRecord, Role};
use crate::slo::cause::DecodeFit;
use crate::slo::spec::{SloKind, SloSet};
use crate::slo::SloEngine;
use headroom::{Capacities, Estimate, Previous, Recent, SloCapacity};
use meter::LoadMeter;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use window::{Sample, SampleWindow};

/// `capacity.window` when none is given.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);
/// The current traffic is read over about this long: a step in load shows in full within it.
pub const LOAD_SPAN: Duration = Duration::from_secs(20);
/// Requests kept for the current traffic: at most this many of the last [`LOAD_SPAN`].
const RECENT: usize = 2048;

#[derive(Debug)]
struct EngineState {
    window: SampleWindow,
    /// The last [`LOAD_SPAN`]'s finished requests (their finish time), for the traffic's shape.
    recent: VecDeque<(Instant, Sample)>,
    /// The last capacities and when they were estimated: each new one is blended into them,
    /// and they stand while the traffic is too thin to scale.
    previous: Option<(Instant, Capacities)>,
}

/// The live capacity estimate of the engine.
#[derive(Debug)]
pub struct CapacityEngine {
    slo: Arc<SloEngine>,
    /// The pod's role: a pool's knee is judged by the SLOs of its phase.
    role: Role,
    /// Generation requests in flight on the engine, whatever their model.
    meter: Arc<LoadMeter>,
    state: Mutex<EngineState>,
}

impl CapacityEngine {
    /// An engine with a `window` of recent requests, judged by `slo`'s SLOs (and telling it
    /// each new decode fit), reading the load `meter` counts, its gauges registered in
    /// `registry`.
    pub fn new(
        window: Duration,
        slo: Arc<SloEngine>,
        role: Role,
        meter: Arc<LoadMeter>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let engine = Arc::new(Self {
            slo,
            role,
            meter,
            state: Mutex::new(EngineState {
                window: SampleWindow::new(window),
                recent: VecDeque::new(),
                previous: None,
            }),
        });
        registry.register_collector(Box::new(CapacityCollector(engine.clone())));
        engine
    }

    /// Adds a finished request to the window (successful ones that carry their load).
    pub fn record(&self, record: &RequestRecord) {
        let Some(load) = record.load.filter(|_| record.outcome == Outcome::Success) else {
            return;
        };
        let secs = |d: Option<Duration>| d.map_or(f32::NAN, |d| d.as_secs_f32());
        let sample = Sample {
            arrival_load: load.arrival as f32,
            decode_load: load.decode.map_or(f32::NAN, |l| l as f32),
            whole_load: load.whole.map_or(f32::NAN, |l| l as f32),
            decode_arrivals: load.decode_arrivals.map_or(f32::NAN, |r| r as f32),
            ttft: secs(record.ttft),
            tpot: secs(record.tpot()),
            e2e: record.e2e.as_secs_f32(),
            output_tokens: record.output_tokens.map_or(f32::NAN, |n| n as f32),
        };
        let now = Instant::now();
        let mut state = self.state.lock().expect("capacity lock");
        state.window.add(now, sample);
        if state.recent.len() == RECENT {
            state.recent.pop_front();
        }
        state.recent.push_back((now, sample));
    }

    /// The engine's estimate at `now` (the fit runs outside the lock).
    pub fn snapshot(&self, now: Instant) -> Estimate {
        let traffic = self.meter.traffic(now, LOAD_SPAN);
        let (recent, window, previous) = {
            let mut state = self.state.lock().expect("capacity lock");
            while state
                .recent
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) > LOAD_SPAN)
            {
                state.recent.pop_front();
            }
            let recent: Vec<Sample> = state.recent.iter().map(|(_, s)| *s).collect();
            (recent, state.window.samples(now), state.previous.clone())
        };
        let recent = traffic.map(|traffic| Recent {
            traffic,
            samples: &recent,
        });
        let previous = previous.as_ref().map(|(at, capacities)| Previous {
            capacities,
            ago: now.saturating_duration_since(*at),
        });
        let estimate = headroom::estimate(&window, recent, &pool_view(&self.slo.set(), self.role), previous);
        let alone = estimate.tpot_base + estimate.tpot_per_request;
        self.state.lock().expect("capacity lock").previous = Some((now, estimate.capacities.clone()));
        self.slo.note_decode_fit(
            (alone.is_finite() && estimate.tpot_per_request.is_finite()).then_some(DecodeFit {
                alone,
                per_request: estimate.tpot_per_request,
            }),
        );
        estimate
    }
}

impl Reader for CapacityEngine {
    fn finished(&self, record: &RequestRecord) {
        self.record(record);
    }

    /// A leg loads the engine as a request does: a prefill leg's answer is its first token.
    fn leg_finished(&self, record: &RequestRecord, phase: LegPhase) {
        match phase {
            LegPhase::Prefill => self.record(&RequestRecord {
                ttft: Some(record.e2e),
                ..record.clone()
            }),
            LegPhase::Decode => self.record(record),
        }
    }
}

/// The SLOs a pod's knee is judged by: a prefill pool's by its TTFT SLOs (it makes only first
/// tokens), a decode pool's by its TPOT SLOs (its TTFT is mostly the prefill pool's), each
/// the ones `goodput.require` names, or all of that kind when it names none; an aggregated
/// pod's, and a P/D router's (what users waited for, both pools together), by
/// `goodput.require` as it is.
fn pool_view(set: &SloSet, role: Role) -> std::borrow::Cow<'_, SloSet> {
    let phase = |slo: &crate::slo::spec::Slo| match role {
        Role::Prefill => matches!(slo.kind, SloKind::Ttft(_)),
        Role::Decode => matches!(slo.kind, SloKind::Tpot(_)),
        Role::Aggregated | Role::Router => true,
    };
    if matches!(role, Role::Aggregated | Role::Router) {
        return std::borrow::Cow::Borrowed(set);
    }
    let of_phase: Vec<usize> = (0..set.slos.len()).filter(|&i| phase(&set.slos[i])).collect();
    let required: Vec<usize> = of_phase
        .iter()
        .copied()
        .filter(|&i| set.goodput_require.contains(&i))
        .collect();
    let mut view = set.clone();
    view.goodput_require = if required.is_empty() { of_phase } else { required };
    std::borrow::Cow::Owned(view)
}

#[derive(Debug, EncodeLabelSet)]
struct TermLabels {
    term: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct BandLabels {
    slo: String,
    concurrency: u64,
}

#[derive(Debug, EncodeLabelSet)]
struct CurveLabels {
    slo: String,
    concurrency: u64,
    source: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct SloLabel {
    slo: String,
}

/// Reads one figure of an SLO's capacity.
type PerSlo = fn(&SloCapacity) -> f64;

/// Encodes the capacity gauges at scrape time.
#[derive(Debug)]
struct CapacityCollector(Arc<CapacityEngine>);

impl Collector for CapacityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let estimate = self.0.snapshot(Instant::now());
        let capacities = &estimate.capacities;
        let gauge = MetricType::Gauge;
        let per_slo: [(&str, &str, PerSlo); 2] = [
            (
                "llmslo_capacity_requests_per_second",
                "Highest arrival rate of generation requests at which the SLO's objective still holds, with the \
                 recent traffic's shape, from the live latency-load model (+Inf: beyond 10x the load seen; NaN: \
                 too few requests or too little spread in load)",
                |c| c.requests_per_second,
            ),
            (
                "llmslo_capacity_concurrency",
                "Mean generation requests in flight on the engine at llmslo_capacity_requests_per_second",
                |c| c.concurrency,
            ),
        ];
        for (name, help, value) in per_slo {
            let mut family = encoder.encode_descriptor(name, help, None, gauge)?;
            for capacity in &capacities.slos {
                let labels = SloLabel {
                    slo: capacity.slo.clone(),
                };
                ConstGauge::new(value(capacity)).encode(family.encode_family(&labels)?)?;
            }
        }
        let engine_wide: [(&str, &str, f64); 8] = [
            (
                "llmslo_capacity_knee_requests_per_second",
                "The engine's knee as an arrival rate: the capacity of the tightest goodput.require SLO (NaN when \
                 one of them is unknown); what fleet rules divide the load by",
                capacities.knee_requests_per_second,
            ),
            (
                "llmslo_capacity_knee_concurrency",
                "Mean generation requests in flight on the engine at the knee",
                capacities.knee_concurrency,
            ),
            (
                "llmslo_capacity_goodput_requests_per_second",
                "Requests per second expected to meet every goodput.require SLO at the knee",
                capacities.goodput_requests_per_second,
            ),
            (
                "llmslo_capacity_goodput_output_tokens_per_second",
                "Goodput output tokens per second at the knee",
                capacities.goodput_output_tokens_per_second,
            ),
            (
                "llmslo_slo_saturation_ratio",
                "The engine's arrival rate over its knee rate (1.0 is at the knee, 0 with no traffic): the \
                 autoscaling signal",
                estimate.saturation,
            ),
            (
                "llmslo_capacity_load_requests_per_second",
                "Generation requests arriving at the engine per second over the last 20 s",
                estimate.load_requests_per_second,
            ),
            (
                "llmslo_capacity_load_concurrency",
                "Mean generation requests in flight on the engine over the last 20 s",
                estimate.load_concurrency,
            ),
            (
                "llmslo_latency_model_fit_ratio",
                "Share of the variation in TPOT the fitted line in load explains (0-1)",
                estimate.fit_ratio,
            ),
        ];
        for (name, help, value) in engine_wide {
            let family = encoder.encode_descriptor(name, help, None, gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_latency_model_tpot_seconds",
            "The fitted TPOT model: TPOT = (base + per_request x generation requests in flight on the engine) / \
             (1 - stall x requests arriving per second); stall 0 when prefills beside the decode show no cost",
            None,
            gauge,
        )?;
        let terms = [
            ("base", estimate.tpot_base),
            ("per_request", estimate.tpot_per_request),
            ("stall", estimate.tpot_stall),
        ];
        for (term, value) in terms {
            ConstGauge::new(value).encode(family.encode_family(&TermLabels { term })?)?;
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_capacity_band_attainment_ratio",
            "Share of the SLO's events that were good, per concurrency band [concurrency, 2 x concurrency) \
             (NaN below min_events)",
            None,
            gauge,
        )?;
        for band in estimate.bands.iter().filter(|b| !b.attainment.is_nan()) {
            let labels = BandLabels {
                slo: band.slo.clone(),
                concurrency: band.concurrency,
            };
            ConstGauge::new(band.attainment).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_capacity_curve_ratio",
            "Latency at the SLO's objective quantile over its threshold, per concurrency band \
             [concurrency, 2 x concurrency): observed in the band, or from the model (1.0 is the SLO's limit)",
            None,
            gauge,
        )?;
        for band in &estimate.bands {
            for (source, value) in [("observed", band.observed_ratio), ("model", band.model_ratio)] {
                if value.is_nan() {
                    continue;
                }
                let labels = CurveLabels {
                    slo: band.slo.clone(),
                    concurrency: band.concurrency,
                    source,
                };
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A capacity engine without SLOs for a pod in `role`, and the meter it reads.
    fn engine(role: Role) -> (Arc<CapacityEngine>, Arc<LoadMeter>) {
        let meter = Arc::new(LoadMeter::default());
        let slo = SloEngine::new(SloSet::default(), &mut Registry::default());
        let engine = CapacityEngine::new(DEFAULT_WINDOW, slo, role, meter.clone(), &mut Registry::default());
        (engine, meter)
    }

    #[tokio::test(start_paused = true)]
    async fn every_request_meets_the_engines_whole_load() {
        let (engine, meter) = engine(Role::Aggregated);
        let now = Instant::now();
        let arrive = || meter::InFlight::arrive(meter.clone(), now);
        let llama = arrive();
        let _qwen = arrive();
        let adapter = arrive();
        assert_eq!(adapter.load(now).arrival, 3.0, "all three models share the engine");
        drop(adapter);
        tokio::time::advance(Duration::from_secs(1)).await;
        let later = Instant::now();
        assert_eq!(llama.load(later).arrival, 1.0, "its own arrival");
        assert_eq!(
            llama.load(later).whole,
            Some(2.0),
            "two in flight throughout its second"
        );
        let now = engine.snapshot(later);
        assert_eq!(
            (now.load_concurrency, now.load_requests_per_second),
            (2.0, 3.0),
            "the engine's mean in flight and its arrivals over the second, no request done yet"
        );
        assert!(now.saturation.is_nan(), "no model yet: {now:?}");
    }

    fn slo_set(yaml: &str) -> SloSet {
        SloSet::validate(None, None, None, serde_yaml::from_str(yaml).unwrap()).unwrap()
    }

    #[test]
    fn a_pools_knee_is_judged_by_the_slos_of_its_phase() {
        let set = slo_set(
            "slos:\n  - {name: ttft, objective: 99, ttft: 500ms}\n  - {name: tpot, objective: 99, tpot: 50ms}\n  \
             - {name: up, objective: 99.9, availability: true}\ngoodput: {require: [ttft, tpot]}\n",
        );
        assert_eq!(pool_view(&set, Role::Prefill).goodput_require, [0]);
        assert_eq!(pool_view(&set, Role::Decode).goodput_require, [1]);
        assert_eq!(pool_view(&set, Role::Aggregated).goodput_require, [0, 1]);
        let only_tpot = slo_set(
            "slos:\n  - {name: ttft, objective: 99, ttft: 500ms}\n  - {name: tpot, objective: 99, tpot: 50ms}\n\
             goodput: {require: [tpot]}\n",
        );
        assert_eq!(
            pool_view(&only_tpot, Role::Prefill).goodput_require,
            [0],
            "no TTFT SLO required: every TTFT SLO"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefill_legs_answer_is_its_first_token_in_the_model() {
        let (engine, meter) = engine(Role::Prefill);
        let now = Instant::now();
        let leg = meter::InFlight::arrive(meter.clone(), now);
        let mut record = RequestRecord::new("m".into(), crate::record::Operation::Chat, Duration::from_millis(120));
        record.load = Some(leg.load(now));
        engine.leg_finished(&record, LegPhase::Prefill);
        let samples = engine.state.lock().unwrap().window.samples(Instant::now());
        assert_eq!(samples.len(), 1);
        assert!((samples[0].ttft - 0.12).abs() < 1e-6, "{:?}", samples[0]);
    }
}
