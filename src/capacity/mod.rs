//! Live SLO capacity of the engine: each request carries the load it ran under, counted on the
//! whole engine (every model, adapter and API: the engine is what saturates); a bounded window
//! of recent requests is fitted against that load at scrape time, and the fit says how much
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
use std::collections::VecDeque;
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
struct EngineState {
    window: SampleWindow,
    /// Meter readings taken at scrapes, for the mean load over the last minute.
    readings: VecDeque<Reading>,
    /// The last minute's finished requests (their finish time), for the load they met.
    recent: VecDeque<(Instant, Sample)>,
}

/// The live capacity estimate of the engine.
#[derive(Debug)]
pub struct CapacityEngine {
    slo: Arc<SloEngine>,
    /// Generation requests in flight on the engine, whatever their model.
    meter: Arc<LoadMeter>,
    state: Mutex<EngineState>,
}

/// The engine's estimate with its current load.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineCapacity {
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
            slo,
            meter: Arc::default(),
            state: Mutex::new(EngineState {
                window: SampleWindow::new(window),
                readings: VecDeque::new(),
                recent: VecDeque::new(),
            }),
        });
        registry.register_collector(Box::new(CapacityCollector(engine.clone())));
        engine
    }

    /// Counts a generation request in flight on the engine from `now` until the guard is
    /// dropped.
    pub fn arrive(&self, now: Instant) -> InFlight {
        InFlight::arrive(self.meter.clone(), now)
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
    pub fn snapshot(&self, now: Instant) -> EngineCapacity {
        let (mean, recent, samples) = {
            let mut state = self.state.lock().expect("capacity lock");
            let mean = mean_in_flight(&self.meter, &mut state, now);
            while state
                .recent
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) > LOAD_SPAN)
            {
                state.recent.pop_front();
            }
            let recent: Vec<Sample> = state.recent.iter().map(|(_, s)| *s).collect();
            (mean, recent, state.window.samples(now))
        };
        let estimate = model::estimate(&samples, &self.slo.set());
        let load = estimate
            .binding
            .and_then(|(latency, objective)| load_met(&recent, latency, objective))
            .unwrap_or(mean);
        EngineCapacity {
            load,
            saturation: load / estimate.knee,
            estimate,
        }
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

/// The engine's mean in flight since the oldest scrape reading of the last minute (the count
/// now at the first scrape).
fn mean_in_flight(meter: &LoadMeter, state: &mut EngineState, now: Instant) -> f64 {
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

/// Encodes the capacity gauges at scrape time.
#[derive(Debug)]
struct CapacityCollector(Arc<CapacityEngine>);

impl Collector for CapacityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let engine = self.0.snapshot(Instant::now());
        let estimate = &engine.estimate;
        let gauge = MetricType::Gauge;
        let mut family = encoder.encode_descriptor(
            "llmslo_capacity_concurrency",
            "Highest concurrency (generation requests in flight on the engine) at which the SLO's \
             objective still holds, from the live latency-load model (+Inf: beyond 10x the load seen; NaN: \
             too few requests or too little spread in load)",
            None,
            gauge,
        )?;
        for (slo, c) in &estimate.capacity {
            ConstGauge::new(*c).encode(family.encode_family(&SloLabel { slo: slo.clone() })?)?;
        }
        let engine_wide: [(&str, &str, f64); 6] = [
            (
                "llmslo_capacity_knee_concurrency",
                "The engine's knee: the capacity of the tightest goodput.require SLO (NaN when one of them is \
                 unknown)",
                estimate.knee,
            ),
            (
                "llmslo_capacity_goodput_requests_per_second",
                "Goodput requests per second at the knee (Little's law: knee concurrency over the modelled e2e there)",
                estimate.goodput_requests_per_second,
            ),
            (
                "llmslo_capacity_goodput_output_tokens_per_second",
                "Goodput output tokens per second at the knee",
                estimate.goodput_output_tokens_per_second,
            ),
            (
                "llmslo_slo_saturation_ratio",
                "The engine's load over its knee (the capacity of the tightest goodput.require SLO): 1.0 is at \
                 the knee; the autoscaling signal",
                engine.saturation,
            ),
            (
                "llmslo_capacity_load_concurrency",
                "The load the last minute's requests met (generation requests in flight on the engine) at the \
                 objective's quantile of the SLO that sets the knee; the mean in flight when none finished",
                engine.load,
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
            "The fitted TPOT line: TPOT = base + per_request x generation requests in flight on the engine",
            None,
            gauge,
        )?;
        for (term, value) in [("base", estimate.tpot_base), ("per_request", estimate.tpot_per_request)] {
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

    #[tokio::test(start_paused = true)]
    async fn every_request_meets_the_engines_whole_load() {
        let engine = CapacityEngine::new(
            DEFAULT_WINDOW,
            SloEngine::new(crate::slo::spec::SloSet::default(), &mut Registry::default()),
            &mut Registry::default(),
        );
        let now = Instant::now();
        let llama = engine.arrive(now);
        let _qwen = engine.arrive(now);
        let adapter = engine.arrive(now);
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
        assert_eq!(
            engine.snapshot(later).load,
            2.0,
            "the engine's mean in flight, no request done yet"
        );
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
