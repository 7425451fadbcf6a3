//! Live SLO capacity: each request carries the load it ran under, counted on the whole engine
//! (every model, adapter and API: the engine is what saturates); a bounded window of recent
//! requests per model is fitted against that load at scrape time, and the fit says how much
//! load the pod can take before each SLO breaks, and how close it is now.

pub mod fit;
pub mod meter;
pub mod model;
pub mod window;

use crate::observe::record::{Outcome, RequestRecord};
use crate::quantile::nearest_rank;
use crate::slo::SloEngine;
use meter::{InFlight, LoadMeter, Reading};
use model::{Estimate, Latency};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use window::{Sample, SampleWindow};

/// `capacity.window` when none is given.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);
/// The current load is read over about this long.
const LOAD_SPAN: Duration = Duration::from_secs(60);
/// Requests kept for the current load: at most this many of the last [`LOAD_SPAN`].
const RECENT: usize = 2048;

#[derive(Debug)]
struct ModelState {
    window: SampleWindow,
    /// Meter readings taken at scrapes, for the mean load over the last minute.
    readings: VecDeque<Reading>,
    /// The last minute's finished requests (their finish time), for the load they met.
    recent: VecDeque<(Instant, Sample)>,
}

/// The live capacity estimate of every model.
#[derive(Debug)]
pub struct CapacityEngine {
    window: Duration,
    slo: Arc<SloEngine>,
    /// Generation requests in flight on the engine, whatever their model.
    meter: Arc<LoadMeter>,
    models: Mutex<BTreeMap<String, ModelState>>,
}

/// One model's estimate with its current load.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCapacity {
    /// The model.
    pub model: String,
    /// The load the last minute's requests met, at the binding SLO's objective quantile
    /// (the mean in flight when none finished).
    pub load: f64,
    /// Current load over the knee: 1.0 is at the knee.
    pub saturation: f64,
    /// What the model says.
    pub estimate: Estimate,
}

impl CapacityEngine {
    /// An engine with a `window` of recent requests, judged by `slo`'s SLOs, its gauges
    /// registered in `registry`.
    pub fn new(window: Duration, slo: Arc<SloEngine>, registry: &mut Registry) -> Arc<Self> {
        let engine = Arc::new(Self {
            window,
            slo,
            meter: Arc::default(),
            models: Mutex::new(BTreeMap::new()),
        });
        registry.register_collector(Box::new(CapacityCollector(engine.clone())));
        engine
    }

    fn with_model<T>(&self, model: &str, f: impl FnOnce(&mut ModelState) -> T) -> T {
        let mut models = self.models.lock().expect("capacity lock");
        if !models.contains_key(model) {
            models.insert(
                model.to_string(),
                ModelState {
                    window: SampleWindow::new(self.window),
                    readings: VecDeque::new(),
                    recent: VecDeque::new(),
                },
            );
        }
        f(models.get_mut(model).expect("inserted above"))
    }

    /// Creates `model`'s state, so that its gauges exist (as NaN) before its first request.
    pub fn create_series(&self, model: &str) {
        self.with_model(model, |_| ());
    }

    /// Counts a request of `model` in flight on the engine from `now` until the guard is
    /// dropped.
    pub fn arrive(&self, model: &str, now: Instant) -> InFlight {
        self.create_series(model);
        InFlight::arrive(self.meter.clone(), now)
    }

    /// Adds a finished request to its model's window (successful ones that carry their load).
    pub fn record(&self, record: &RequestRecord) {
        let Some(load) = record.load.filter(|_| record.outcome == Outcome::Success) else {
            return;
        };
        let secs = |d: Option<Duration>| d.map_or(f32::NAN, |d| d.as_secs_f32());
        let sample = Sample {
            arrival_load: load.arrival as f32,
            decode_load: load.decode.map_or(f32::NAN, |l| l as f32),
            whole_load: load.whole.map_or(f32::NAN, |l| l as f32),
            ttft: secs(record.ttft),
            tpot: secs(record.tpot()),
            e2e: record.e2e.as_secs_f32(),
            output_tokens: record.output_tokens.map_or(f32::NAN, |n| n as f32),
        };
        let now = Instant::now();
        self.with_model(&record.model, |state| {
            state.window.add(now, sample);
            if state.recent.len() == RECENT {
                state.recent.pop_front();
            }
            state.recent.push_back((now, sample));
        });
    }

    /// Every model's estimate at `now` (the fits run outside the lock).
    pub fn snapshot(&self, now: Instant) -> Vec<ModelCapacity> {
        type Window = (String, f64, Vec<Sample>, Vec<Sample>);
        let windows: Vec<Window> = {
            let mut models = self.models.lock().expect("capacity lock");
            models
                .iter_mut()
                .map(|(model, state)| {
                    let mean = mean_in_flight(&self.meter, state, now);
                    while state
                        .recent
                        .front()
                        .is_some_and(|(at, _)| now.saturating_duration_since(*at) > LOAD_SPAN)
                    {
                        state.recent.pop_front();
                    }
                    let recent = state.recent.iter().map(|(_, s)| *s).collect();
                    (model.clone(), mean, recent, state.window.samples(now))
                })
                .collect()
        };
        let set = self.slo.set();
        windows
            .into_iter()
            .map(|(model, mean, recent, samples)| {
                let estimate = model::estimate(&samples, &set);
                let load = estimate
                    .binding
                    .and_then(|(latency, objective)| load_met(&recent, latency, objective))
                    .unwrap_or(mean);
                ModelCapacity {
                    model,
                    load,
                    saturation: load / estimate.knee,
                    estimate,
                }
            })
            .collect()
    }
}

/// The load `recent` requests met, in `latency`'s terms, at the `objective` quantile: the
/// mean in flight for steady load, more when bursts meet the SLO's tail.
fn load_met(recent: &[Sample], latency: Latency, objective: f64) -> Option<f64> {
    let mut loads: Vec<f64> = recent.iter().filter_map(|s| latency.load(s)).collect();
    if loads.is_empty() {
        return None;
    }
    loads.sort_by(f64::total_cmp);
    Some(nearest_rank(&loads, objective))
}

/// The engine's mean in flight since `state`'s oldest scrape reading of the last minute (the
/// count now at the first scrape).
fn mean_in_flight(meter: &LoadMeter, state: &mut ModelState, now: Instant) -> f64 {
    let reading = meter.read(now);
    while state
        .readings
        .front()
        .is_some_and(|r| now.saturating_duration_since(r.at) > LOAD_SPAN)
    {
        state.readings.pop_front();
    }
    let load = state
        .readings
        .front()
        .and_then(|oldest| oldest.mean_until(&reading))
        .unwrap_or(reading.in_flight as f64);
    state.readings.push_back(reading);
    load
}

#[derive(Debug, EncodeLabelSet)]
struct TermLabels {
    model: String,
    term: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct BandLabels {
    slo: String,
    model: String,
    concurrency: u64,
}

#[derive(Debug, EncodeLabelSet)]
struct CurveLabels {
    slo: String,
    model: String,
    concurrency: u64,
    source: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Debug, EncodeLabelSet)]
struct SloModelLabels {
    slo: String,
    model: String,
}

/// Encodes the capacity gauges at scrape time.
#[derive(Debug)]
struct CapacityCollector(Arc<CapacityEngine>);

impl Collector for CapacityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let models = self.0.snapshot(Instant::now());
        let gauge = MetricType::Gauge;
        let model_label = |m: &ModelCapacity| ModelLabel { model: m.model.clone() };
        let mut family = encoder.encode_descriptor(
            "llmslo_capacity_concurrency",
            "Highest concurrency (requests in flight) at which the SLO's objective still holds, from the \
             live latency-load model (+Inf: beyond 10x the load seen; NaN: too few requests or too little \
             spread in load)",
            None,
            gauge,
        )?;
        for m in &models {
            for (slo, c) in &m.estimate.capacity {
                let labels = SloModelLabels {
                    slo: slo.clone(),
                    model: m.model.clone(),
                };
                ConstGauge::new(*c).encode(family.encode_family(&labels)?)?;
            }
        }
        type PerModel = fn(&ModelCapacity) -> f64;
        let per_model: [(&str, &str, PerModel); 6] = [
            (
                "llmslo_capacity_knee_concurrency",
                "The knee: the capacity of the tightest goodput.require SLO (NaN when one of them is unknown)",
                |m| m.estimate.knee,
            ),
            (
                "llmslo_capacity_goodput_requests_per_second",
                "Goodput requests per second at the knee (Little's law: knee concurrency over the modelled e2e there)",
                |m| m.estimate.goodput_requests_per_second,
            ),
            (
                "llmslo_capacity_goodput_output_tokens_per_second",
                "Goodput output tokens per second at the knee",
                |m| m.estimate.goodput_output_tokens_per_second,
            ),
            (
                "llmslo_slo_saturation_ratio",
                "The load over the knee (the capacity of the tightest goodput.require SLO): 1.0 is at \
                 the knee",
                |m| m.saturation,
            ),
            (
                "llmslo_capacity_load_concurrency",
                "The load the last minute's requests met (requests in flight) at the objective's quantile \
                 of the SLO that sets the knee; the mean in flight when none finished",
                |m| m.load,
            ),
            (
                "llmslo_latency_model_fit_ratio",
                "Share of the variation in TPOT the fitted line in load explains (0-1)",
                |m| m.estimate.fit_ratio,
            ),
        ];
        for (name, help, value) in per_model {
            let mut family = encoder.encode_descriptor(name, help, None, gauge)?;
            for m in &models {
                ConstGauge::new(value(m)).encode(family.encode_family(&model_label(m))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_latency_model_tpot_seconds",
            "The fitted TPOT line: TPOT = base + per_request x requests in flight",
            None,
            gauge,
        )?;
        for m in &models {
            for (term, value) in [
                ("base", m.estimate.tpot_base),
                ("per_request", m.estimate.tpot_per_request),
            ] {
                let labels = TermLabels {
                    model: m.model.clone(),
                    term,
                };
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_capacity_band_attainment_ratio",
            "Share of the SLO's events that were good, per concurrency band [concurrency, 2 x concurrency) \
             (NaN below min_events)",
            None,
            gauge,
        )?;
        for m in &models {
            for band in m.estimate.bands.iter().filter(|b| !b.attainment.is_nan()) {
                let labels = BandLabels {
                    slo: band.slo.clone(),
                    model: m.model.clone(),
                    concurrency: band.concurrency,
                };
                ConstGauge::new(band.attainment).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_capacity_curve_ratio",
            "Latency at the SLO's objective quantile over its threshold, per concurrency band \
             [concurrency, 2 x concurrency): observed in the band, or from the model (1.0 is the SLO's limit)",
            None,
            gauge,
        )?;
        for m in &models {
            for band in &m.estimate.bands {
                for (source, value) in [("observed", band.observed_ratio), ("model", band.model_ratio)] {
                    if value.is_nan() {
                        continue;
                    }
                    let labels = CurveLabels {
                        slo: band.slo.clone(),
                        model: m.model.clone(),
                        concurrency: band.concurrency,
                        source,
                    };
                    ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_model_meets_the_engines_whole_load() {
        let engine = CapacityEngine::new(
            DEFAULT_WINDOW,
            SloEngine::new(crate::slo::spec::SloSet::default(), &mut Registry::default()),
            &mut Registry::default(),
        );
        let now = Instant::now();
        let llama = engine.arrive("llama", now);
        let _qwen = engine.arrive("qwen", now);
        let adapter = engine.arrive("llama-lora", now);
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
        let loads: Vec<f64> = engine.snapshot(later).iter().map(|m| m.load).collect();
        assert_eq!(loads, [2.0, 2.0, 2.0], "every model reads the engine's load");
    }

    fn sample(arrival: f32, decode: f32) -> Sample {
        Sample {
            arrival_load: arrival,
            decode_load: decode,
            whole_load: decode,
            ttft: 0.1,
            tpot: 0.02,
            e2e: 1.0,
            output_tokens: 32.0,
        }
    }

    #[test]
    fn the_load_that_counts_is_read_at_the_objective_in_the_slos_terms() {
        // Steady at 10 but for a burst of 6 requests out of 100 at 30.
        let recent: Vec<Sample> = (0..100)
            .map(|i| if i < 6 { sample(1.0, 30.0) } else { sample(1.0, 10.0) })
            .collect();
        assert_eq!(load_met(&recent, Latency::Tpot, 0.90), Some(10.0));
        assert_eq!(
            load_met(&recent, Latency::Tpot, 0.95),
            Some(30.0),
            "the burst meets a 95 % SLO's tail"
        );
        assert_eq!(load_met(&recent, Latency::Ttft, 0.95), Some(1.0));
        let unknown = [sample(1.0, f32::NAN)];
        assert_eq!(load_met(&unknown, Latency::Tpot, 0.95), None);
        assert_eq!(load_met(&[], Latency::Tpot, 0.95), None);
    }
}
