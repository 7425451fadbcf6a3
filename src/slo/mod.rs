//! SLOs evaluated live: each finished request is classified per SLO, counted,
//! and added to sliding windows; error ratios, burn rates, budgets and goodput are computed
//! from those windows when Prometheus scrapes. `rules` turns the same SLO file into
//! Prometheus recording and alerting rules.

pub mod cause;
pub mod rules;
pub mod spec;
pub mod window;

use crate::record::{Engine, Outcome, Reader, RequestRecord};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use spec::{Slo, SloKind, SloSet};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::time::Instant;
use window::{Windows, WINDOWS};

/// How one request stands against one SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not a valid event for this SLO (client's doing, or nothing to judge).
    NotCounted,
    /// A good event.
    Good,
    /// A bad event.
    Bad,
}

/// Classifies `record` against `slo`, at full precision (not from histogram buckets).
pub fn classify(slo: &Slo, record: &RequestRecord) -> Verdict {
    let within = |value: Option<Duration>, threshold: Duration| match value {
        Some(value) if record.outcome == Outcome::Success => {
            if value <= threshold {
                Verdict::Good
            } else {
                Verdict::Bad
            }
        }
        _ => Verdict::NotCounted,
    };
    match slo.kind {
        SloKind::Availability => match record.outcome {
            Outcome::Success => Verdict::Good,
            Outcome::UpstreamError | Outcome::Timeout | Outcome::ConnectError => Verdict::Bad,
            Outcome::ClientError | Outcome::ClientCancelled => Verdict::NotCounted,
        },
        SloKind::Ttft(_) | SloKind::AnswerTtft(_) if !slo.prompt.judges(record.input_tokens) => Verdict::NotCounted,
        SloKind::Ttft(threshold) => within(record.ttft, slo.prompt.threshold(threshold, record.input_tokens)),
        SloKind::AnswerTtft(threshold) => {
            within(record.answer_ttft, slo.prompt.threshold(threshold, record.input_tokens))
        }
        SloKind::Tpot(threshold) => within(record.tpot(), threshold),
        SloKind::E2e(threshold) => within(Some(record.e2e), threshold),
    }
}

/// Whether `record` counts as goodput: it succeeded and no SLO that decides goodput
/// ([`SloSet::decides_goodput`]) judged it bad (`verdicts` holds its verdict for each SLO of
/// `set`, in order).
pub fn is_goodput(set: &SloSet, record: &RequestRecord, verdicts: &[Verdict]) -> bool {
    record.outcome == Outcome::Success
        && verdicts
            .iter()
            .enumerate()
            .all(|(i, verdict)| *verdict != Verdict::Bad || !set.decides_goodput(i))
}

/// `slo_service`, `slo`, `model`: the SLO file's service keeps two teams' SLOs of the same
/// name apart in fleet rules. (Not `service`: a ServiceMonitor attaches that target label,
/// the Kubernetes Service's name, and Prometheus would rename ours `exported_service`.)
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct SloLabels {
    /// The SLO file's `service`.
    pub slo_service: String,
    /// The SLO's name.
    pub slo: String,
    /// Normalised model.
    pub model: String,
}

/// `slo_service`, `model`: goodput is defined by an SLO file's `goodput.require`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ServiceModelLabels {
    /// The SLO file's `service`.
    pub slo_service: String,
    /// Normalised model.
    pub model: String,
}

/// `slo_service`, `slo`, `model`, `cause`, `evidence`: a bad event's cause and what it was
/// decided from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CauseLabels {
    /// The SLO file's `service`.
    pub slo_service: String,
    /// The SLO's name.
    pub slo: String,
    /// Normalised model.
    pub model: String,
    /// Why it was bad.
    pub cause: &'static str,
    /// What the cause was decided from.
    pub evidence: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct SloWindowLabels {
    slo_service: String,
    slo: String,
    model: String,
    window: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct ServiceModelWindowLabels {
    slo_service: String,
    model: String,
    window: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct WindowLabel {
    window: &'static str,
}

/// Per service and model: requests judged for goodput, goodput requests, goodput output tokens.
type GoodputWindows = Windows<3>;
/// Per SLO and model: events, bad events.
type SloWindows = Windows<2>;

#[derive(Debug, Default)]
struct State {
    slos: BTreeMap<SloLabels, SloWindows>,
    goodput: BTreeMap<ServiceModelLabels, GoodputWindows>,
}

/// The live SLO evaluation: counters, windows and the scrape-time gauges.
#[derive(Debug)]
pub struct SloEngine {
    set: RwLock<Arc<SloSet>>,
    started: Instant,
    state: Mutex<State>,
    events: Family<SloLabels, Counter>,
    bad_events: Family<SloLabels, Counter>,
    bad_events_by_cause: Family<CauseLabels, Counter>,
    goodput_judged: Family<ServiceModelLabels, Counter>,
    goodput_requests: Family<ServiceModelLabels, Counter>,
    goodput_tokens: Family<ServiceModelLabels, Counter>,
    /// The capacity model's latest fit of TPOT against the requests sharing the decode, for
    /// the causes of the TPOT SLOs' bad events.
    decode_fit: Mutex<Option<cause::DecodeFit>>,
}

impl SloEngine {
    /// An engine for `set`, registering its counters and gauges in `registry`.
    pub fn new(set: SloSet, registry: &mut Registry) -> Arc<Self> {
        let engine = Arc::new(Self {
            set: RwLock::new(Arc::new(set)),
            started: Instant::now(),
            state: Mutex::new(State::default()),
            events: Family::default(),
            bad_events: Family::default(),
            bad_events_by_cause: Family::default(),
            goodput_judged: Family::default(),
            goodput_requests: Family::default(),
            goodput_tokens: Family::default(),
            decode_fit: Mutex::new(None),
        });
        registry.register(
            "llmslo_slo_events",
            "Requests judged by each SLO",
            engine.events.clone(),
        );
        registry.register(
            "llmslo_slo_bad_events",
            "Requests that missed each SLO",
            engine.bad_events.clone(),
        );
        registry.register(
            "llmslo_slo_bad_events_by_cause",
            "Requests that missed each latency SLO, by cause (queueing, prefill, decode_contention, preemption, \
             outside_engine, unknown) and the evidence it was decided from (request, engine_metrics, load, none)",
            engine.bad_events_by_cause.clone(),
        );
        registry.register(
            "llmslo_goodput_judged_requests",
            "Generation requests judged for goodput: all but client errors and cancellations, and none \
             without SLOs",
            engine.goodput_judged.clone(),
        );
        registry.register(
            "llmslo_goodput_requests",
            "Successful requests that met every SLO under goodput.require",
            engine.goodput_requests.clone(),
        );
        registry.register(
            "llmslo_goodput_output_tokens",
            "Output tokens of goodput requests",
            engine.goodput_tokens.clone(),
        );
        registry.register_collector(Box::new(SloCollector(engine.clone())));
        engine
    }

    /// The SLOs in force.
    pub fn set(&self) -> Arc<SloSet> {
        self.set.read().expect("slo set lock").clone()
    }

    /// Puts a new SLO set in force; windows of SLOs that keep their name (and service) keep
    /// their history.
    pub fn reload(&self, set: SloSet) {
        let mut state = self.state.lock().expect("slo state lock");
        state
            .slos
            .retain(|labels, _| set.slos.iter().any(|s| s.name == labels.slo));
        let old = self.set();
        if old.period != set.period || old.service != set.service {
            state.slos.clear();
            state.goodput.clear();
        }
        *self.set.write().expect("slo set lock") = Arc::new(set);
    }

    /// Creates `model`'s counters and windows at zero for every SLO.
    pub fn create_series(&self, model: &str) {
        let set = self.set();
        let now = Instant::now();
        let mut state = self.state.lock().expect("slo state lock");
        for slo in &set.slos {
            let labels = SloLabels {
                slo_service: set.service.clone(),
                slo: slo.name.clone(),
                model: model.to_string(),
            };
            drop(self.events.get_or_create(&labels));
            drop(self.bad_events.get_or_create(&labels));
            state
                .slos
                .entry(labels)
                .or_insert_with(|| Windows::new(set.period, now));
        }
        let label = ServiceModelLabels {
            slo_service: set.service.clone(),
            model: model.to_string(),
        };
        if set.judges_goodput() {
            drop(self.goodput_judged.get_or_create(&label));
            drop(self.goodput_requests.get_or_create(&label));
            drop(self.goodput_tokens.get_or_create(&label));
        }
        state
            .goodput
            .entry(label)
            .or_insert_with(|| Windows::new(set.period, now));
    }

    /// Notes the capacity model's latest decode fit (none while it has none).
    pub fn note_decode_fit(&self, fit: Option<cause::DecodeFit>) {
        *self.decode_fit.lock().expect("decode fit lock") = fit;
    }

    /// Judges a finished request against every SLO and goodput, and finds the cause of each
    /// latency SLO it missed; `decode_fit` gives the capacity model's TPOT fit, when there is
    /// one.
    pub fn record(&self, record: &RequestRecord, decode_fit: impl FnOnce() -> Option<cause::DecodeFit>) {
        let set = self.set();
        let now = Instant::now();
        let verdicts: Vec<Verdict> = set.slos.iter().map(|slo| classify(slo, record)).collect();
        let missed_latency =
            |(slo, verdict): (&spec::Slo, &Verdict)| *verdict == Verdict::Bad && slo.kind != SloKind::Availability;
        // Asked only when a cause is to be found, and before the state lock is taken.
        let decode_fit = set
            .slos
            .iter()
            .zip(&verdicts)
            .any(missed_latency)
            .then(decode_fit)
            .flatten();
        let good = is_goodput(&set, record, &verdicts);
        let tokens = if good { record.output_tokens.unwrap_or(0) } else { 0 };

        let mut state = self.state.lock().expect("slo state lock");
        for (slo, verdict) in set.slos.iter().zip(&verdicts) {
            if *verdict == Verdict::NotCounted {
                continue;
            }
            let labels = SloLabels {
                slo_service: set.service.clone(),
                slo: slo.name.clone(),
                model: record.model.clone(),
            };
            let bad = u64::from(*verdict == Verdict::Bad);
            self.events.get_or_create(&labels).inc();
            self.bad_events.get_or_create(&labels).inc_by(bad);
            if missed_latency((slo, verdict)) {
                let diagnosis = cause::diagnose(slo.kind, record, decode_fit);
                self.bad_events_by_cause
                    .get_or_create(&CauseLabels {
                        slo_service: labels.slo_service.clone(),
                        slo: labels.slo.clone(),
                        model: labels.model.clone(),
                        cause: diagnosis.cause.as_str(),
                        evidence: diagnosis.evidence.as_str(),
                    })
                    .inc();
            }
            let windows = state
                .slos
                .entry(labels)
                .or_insert_with(|| Windows::new(set.period, now));
            windows.add(now, [1, bad]);
        }
        // Goodput is generation's: embeddings and other pooling work are judged by their SLOs
        // only. Client errors and cancellations are never judged.
        if !record.operation.is_generation() {
            return;
        }
        let label = ServiceModelLabels {
            slo_service: set.service.clone(),
            model: record.model.clone(),
        };
        let windows = state
            .goodput
            .entry(label.clone())
            .or_insert_with(|| Windows::new(set.period, now));
        // Without SLOs there is nothing to judge goodput by: nothing is counted and its gauges
        // read NaN (a success is not goodput by default).
        let judged = set.judges_goodput() && !matches!(record.outcome, Outcome::ClientError | Outcome::ClientCancelled);
        if !judged {
            return;
        }
        self.goodput_judged.get_or_create(&label).inc();
        if good {
            self.goodput_requests.get_or_create(&label).inc();
            self.goodput_tokens.get_or_create(&label).inc_by(tokens);
        }
        windows.add(now, [1, u64::from(good), tokens]);
    }

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
        for (labels, windows) in &mut state.slos {
            let Some(slo) = set.slos.iter().find(|s| s.name == labels.slo) else {
                continue;
            };
            let sums = windows.sums(now);
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
            let [events, bad] = windows.period_sum(now);
            let spent = if events == 0 {
                0.0
            } else {
                bad as f64 / events as f64 / slo.error_budget()
            };
            snapshot.budget_remaining.push((labels.clone(), 1.0 - spent));
        }
        // Nothing judges goodput without SLOs: every goodput gauge is NaN.
        let judging = set.judges_goodput();
        for (labels, windows) in &mut state.goodput {
            for ((name, length), [judged, good, tokens]) in WINDOWS.iter().zip(windows.sums(now)) {
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

impl Reader for SloEngine {
    fn model_known(&self, model: &str, _provider: Option<Engine>) {
        self.create_series(model);
    }

    fn finished(&self, record: &RequestRecord) {
        self.record(record, || *self.decode_fit.lock().expect("decode fit lock"));
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
struct SloCollector(Arc<SloEngine>);

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
                    window,
                };
                ConstGauge::new(*v).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Operation;
    use spec::SloFile;

    const MIN: Duration = Duration::from_secs(60);

    fn engine() -> Arc<SloEngine> {
        let file: SloFile = serde_yaml::from_str(
            "slos:\n  - {name: ttft, objective: 99, ttft: 500ms}\n  - {name: tpot, objective: 99, tpot: 50ms}\n  \
             - {name: avail, objective: 99.9, availability: true}\ngoodput: {require: [ttft, tpot]}\n",
        )
        .unwrap();
        let set = SloSet::validate(Some("chat".into()), None, Some(20), file).unwrap();
        SloEngine::new(set, &mut Registry::default())
    }

    fn request(outcome: Outcome, ttft_ms: u64, tpot_ms: u64) -> RequestRecord {
        RequestRecord {
            model: "m".into(),
            operation: Operation::Chat,
            outcome,
            ttft: Some(Duration::from_millis(ttft_ms)),
            answer_ttft: Some(Duration::from_millis(ttft_ms)),
            tpot_per_choice: vec![Duration::from_millis(tpot_ms)],
            e2e: Duration::from_secs(1),
            output_tokens: Some(10),
            input_tokens: Some(5),
            reasoning_tokens: None,
            token_events: 10,
            count_source: None,
            load: None,
            engine: None,
            engine_context: None,
            trace: None,
            provider: None,
            unmeasured: None,
        }
    }

    fn send(engine: &SloEngine, n: usize, record: &RequestRecord) {
        for _ in 0..n {
            engine.record(record, || None);
        }
    }

    fn ratio(s: &Snapshot, slo: &str, window: &str) -> f64 {
        s.error_ratio
            .iter()
            .find(|(l, w, _)| l.slo == slo && *w == window)
            .unwrap()
            .2
    }

    fn burn(s: &Snapshot, slo: &str, window: &str) -> f64 {
        s.burn_rate
            .iter()
            .find(|(l, w, _)| l.slo == slo && *w == window)
            .unwrap()
            .2
    }

    fn budget(s: &Snapshot, slo: &str) -> f64 {
        s.budget_remaining.iter().find(|(l, _)| l.slo == slo).unwrap().1
    }

    fn per_model(values: &[(ServiceModelLabels, &'static str, f64)], window: &str) -> f64 {
        values.iter().find(|(_, w, _)| *w == window).unwrap().2
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_ttft_slo_judges_long_prompts_by_their_allowance_or_not_at_all() {
        let file: SloFile = serde_yaml::from_str(
            "slos:\n  - {name: short, objective: 99, ttft: 500ms, max_prompt_tokens: 4096}\n  \
             - {name: scaled, objective: 99, ttft: 500ms, per_1k_prompt_tokens: 100ms}\n",
        )
        .unwrap();
        let set = SloSet::validate(None, None, None, file).unwrap();
        let [short, scaled] = [&set.slos[0], &set.slos[1]];
        let prompt = |tokens: Option<u64>, ttft_ms: u64| {
            let mut r = request(Outcome::Success, ttft_ms, 10);
            r.input_tokens = tokens;
            r
        };
        assert_eq!(classify(short, &prompt(Some(8000), 1400)), Verdict::NotCounted);
        assert_eq!(classify(short, &prompt(Some(4096), 600)), Verdict::Bad);
        assert_eq!(classify(short, &prompt(None, 600)), Verdict::Bad, "unknown: judged");
        assert_eq!(
            classify(scaled, &prompt(Some(8000), 1300)),
            Verdict::Good,
            "500 + 8 x 100 ms"
        );
        assert_eq!(classify(scaled, &prompt(Some(8000), 1301)), Verdict::Bad);
        assert_eq!(classify(scaled, &prompt(None, 501)), Verdict::Bad);
    }

    #[test]
    fn classification_follows_the_design() {
        let set = engine().set();
        let [ttft, tpot, avail] = [&set.slos[0], &set.slos[1], &set.slos[2]];
        assert_eq!(
            classify(ttft, &request(Outcome::Success, 500, 10)),
            Verdict::Good,
            "the threshold is inclusive"
        );
        assert_eq!(classify(ttft, &request(Outcome::Success, 501, 10)), Verdict::Bad);
        assert_eq!(classify(tpot, &request(Outcome::Success, 1, 51)), Verdict::Bad);
        assert_eq!(
            classify(ttft, &request(Outcome::UpstreamError, 900, 10)),
            Verdict::NotCounted
        );
        assert_eq!(classify(avail, &request(Outcome::UpstreamError, 1, 1)), Verdict::Bad);
        assert_eq!(classify(avail, &request(Outcome::Timeout, 1, 1)), Verdict::Bad);
        assert_eq!(
            classify(avail, &request(Outcome::ClientCancelled, 1, 1)),
            Verdict::NotCounted
        );
        assert_eq!(
            classify(avail, &request(Outcome::ClientError, 1, 1)),
            Verdict::NotCounted
        );
        let mut whole = request(Outcome::Success, 0, 0);
        whole.ttft = None;
        whole.tpot_per_choice.clear();
        assert_eq!(
            classify(ttft, &whole),
            Verdict::NotCounted,
            "non-streaming: no TTFT to judge"
        );
        assert_eq!(classify(avail, &whole), Verdict::Good);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_traffic() {
        let engine = engine();
        engine.create_series("m");
        tokio::time::advance(10 * MIN).await;
        let s = engine.snapshot(Instant::now());
        assert!(ratio(&s, "avail", "5m").is_nan() && burn(&s, "avail", "1h").is_nan());
        assert_eq!(budget(&s, "avail"), 1.0);
        assert_eq!(per_model(&s.goodput_rps, "5m"), 0.0);
        assert!(per_model(&s.attainment, "5m").is_nan());
    }

    #[tokio::test(start_paused = true)]
    async fn below_min_events_ratios_are_nan() {
        let engine = engine();
        send(&engine, 19, &request(Outcome::UpstreamError, 1, 1));
        let s = engine.snapshot(Instant::now());
        assert!(ratio(&s, "avail", "5m").is_nan());
        assert!(burn(&s, "avail", "3d").is_nan());
        assert!(budget(&s, "avail") < 0.0, "the budget still counts every event");
        engine.record(&request(Outcome::UpstreamError, 1, 1), || None);
        assert_eq!(ratio(&engine.snapshot(Instant::now()), "avail", "5m"), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_known_pattern_through_the_windows() {
        let engine = engine();
        // Minute 0: 95 good and 5 engine errors.
        send(&engine, 95, &request(Outcome::Success, 100, 10));
        send(&engine, 5, &request(Outcome::UpstreamError, 1, 1));
        let s = engine.snapshot(Instant::now());
        assert!(close(ratio(&s, "avail", "5m"), 0.05));
        assert!(close(burn(&s, "avail", "5m"), 50.0), "0.05 / 0.001");
        assert!(close(budget(&s, "avail"), 1.0 - 50.0));
        assert_eq!(
            ratio(&s, "ttft", "5m"),
            0.0,
            "95 fast successes; the errors are not TTFT events"
        );

        // Minute 10: 100 good more. The 5m window holds only them; 30m holds everything.
        tokio::time::advance(10 * MIN).await;
        send(&engine, 100, &request(Outcome::Success, 100, 10));
        let s = engine.snapshot(Instant::now());
        assert!(close(ratio(&s, "avail", "5m"), 0.0));
        assert!(close(ratio(&s, "avail", "30m"), 5.0 / 200.0));
        assert!(close(burn(&s, "avail", "1h"), 25.0));
        assert!(close(budget(&s, "avail"), 1.0 - 25.0));
        // Goodput: 195 good of 200 valid; per second of min(uptime, window).
        assert!(close(per_model(&s.attainment, "1h"), 195.0 / 200.0));
        assert!(
            close(per_model(&s.goodput_rps, "1h"), 195.0 / 600.0),
            "uptime 10 min < 1h"
        );
        assert!(close(per_model(&s.goodput_rps, "5m"), 100.0 / 300.0));
        assert!(close(per_model(&s.goodput_tps, "1h"), 1950.0 / 600.0));
        let coverage: BTreeMap<_, _> = s.coverage.iter().copied().collect();
        assert!(close(coverage["5m"], 1.0) && close(coverage["30m"], 1.0 / 3.0) && close(coverage["1h"], 1.0 / 6.0));

        // Four days later: every alerting window is empty; the 30-day period still counts.
        tokio::time::advance(Duration::from_secs(4 * 86_400)).await;
        let s = engine.snapshot(Instant::now());
        assert!(ratio(&s, "avail", "3d").is_nan());
        assert!(close(budget(&s, "avail"), 1.0 - 25.0));
    }

    #[tokio::test(start_paused = true)]
    async fn an_all_bad_burst_and_goodput_misses() {
        let engine = engine();
        send(&engine, 30, &request(Outcome::Success, 900, 10)); // slow first token
        send(&engine, 30, &request(Outcome::Success, 100, 80)); // slow decode
        send(&engine, 40, &request(Outcome::Success, 100, 10));
        send(&engine, 10, &request(Outcome::ClientCancelled, 100, 10));
        let s = engine.snapshot(Instant::now());
        assert!(close(ratio(&s, "ttft", "5m"), 30.0 / 100.0));
        assert!(close(ratio(&s, "tpot", "5m"), 30.0 / 100.0));
        assert!(close(burn(&s, "ttft", "5m"), 30.0));
        assert!(
            close(per_model(&s.attainment, "5m"), 40.0 / 100.0),
            "cancelled requests are not valid"
        );
        let text = {
            let mut registry = Registry::default();
            let e = SloEngine::new(engine.set().as_ref().clone(), &mut registry);
            send(&e, 3, &request(Outcome::Success, 100, 10));
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
            out
        };
        assert!(text.contains("llmslo_goodput_requests_total{slo_service=\"chat\",model=\"m\"} 3"));
        assert!(text.contains("llmslo_goodput_judged_requests_total{slo_service=\"chat\",model=\"m\"} 3"));
        assert!(text.contains("llmslo_goodput_output_tokens_total{slo_service=\"chat\",model=\"m\"} 30"));
        assert!(text.contains("llmslo_slo_events_total{slo_service=\"chat\",slo=\"ttft\",model=\"m\"} 3"));
        assert!(
            text.contains("llmslo_slo_error_ratio{slo_service=\"chat\",slo=\"avail\",model=\"m\",window=\"5m\"} NaN")
        );
        assert!(text.contains("llmslo_slo_attainment_ratio{slo_service=\"chat\",model=\"m\",window=\"5m\"} 1.0"));
        assert!(text.contains("llmslo_slo_window_coverage_ratio{window=\"3d\"} 0.0"));
    }

    #[tokio::test(start_paused = true)]
    async fn without_goodput_require_every_slo_decides_goodput() {
        let file: SloFile = serde_yaml::from_str(
            "slos:\n  - {name: ttft, objective: 99, ttft: 500ms}\n  - {name: tpot, objective: 99, tpot: 50ms}\n",
        )
        .unwrap();
        let set = SloSet::validate(Some("chat".into()), None, Some(1), file).unwrap();
        let engine = SloEngine::new(set, &mut Registry::default());
        send(&engine, 3, &request(Outcome::Success, 100, 10));
        send(&engine, 1, &request(Outcome::Success, 900, 10)); // slow first token
        send(&engine, 1, &request(Outcome::Success, 100, 80)); // slow decode
        let s = engine.snapshot(Instant::now());
        assert!(close(per_model(&s.attainment, "5m"), 3.0 / 5.0), "not 'every success'");
    }

    #[tokio::test(start_paused = true)]
    async fn without_slos_nothing_is_judged_and_goodput_reads_nan() {
        let set = SloSet::validate(Some("chat".into()), None, Some(1), SloFile::default()).unwrap();
        let mut registry = Registry::default();
        let engine = SloEngine::new(set, &mut registry);
        engine.create_series("m");
        send(&engine, 5, &request(Outcome::Success, 100, 10));
        tokio::time::advance(MIN).await;
        let s = engine.snapshot(Instant::now());
        for values in [&s.goodput_rps, &s.goodput_tps, &s.attainment] {
            assert!(per_model(values, "5m").is_nan(), "nothing judged, not 100 %");
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            !text.contains("llmslo_goodput_requests_total{"),
            "no goodput counted: {text}"
        );
        assert!(!text.contains("llmslo_goodput_judged_requests_total{"));
        assert!(text.contains("llmslo_slo_attainment_ratio{slo_service=\"chat\",model=\"m\",window=\"5m\"} NaN"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_that_renames_the_service_starts_its_windows_afresh() {
        let engine = engine();
        send(&engine, 30, &request(Outcome::UpstreamError, 1, 1));
        let mut renamed = engine.set().as_ref().clone();
        renamed.service = "search".into();
        engine.reload(renamed);
        engine.record(&request(Outcome::Success, 100, 10), || None);
        let s = engine.snapshot(Instant::now());
        assert!(s.error_ratio.iter().all(|(l, _, _)| l.slo_service == "search"));
        assert!(
            ratio(&s, "avail", "5m").is_nan(),
            "one event of the new service, below min_events"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pooling_work_counts_for_availability_but_not_for_goodput() {
        let engine = engine();
        send(&engine, 30, &request(Outcome::Success, 100, 10));
        let mut embedding = request(Outcome::Success, 0, 0);
        embedding.operation = Operation::Embeddings;
        (embedding.ttft, embedding.answer_ttft, embedding.output_tokens) = (None, None, None);
        embedding.tpot_per_choice.clear();
        send(&engine, 10, &embedding);
        send(
            &engine,
            10,
            &RequestRecord {
                outcome: Outcome::UpstreamError,
                ..embedding.clone()
            },
        );
        let s = engine.snapshot(Instant::now());
        assert!(
            close(ratio(&s, "avail", "5m"), 10.0 / 50.0),
            "every route answers to availability"
        );
        assert!(
            close(ratio(&s, "ttft", "5m"), 0.0),
            "only streamed generation has a TTFT"
        );
        assert!(close(per_model(&s.attainment, "5m"), 1.0), "goodput is generation's");
    }

    #[tokio::test(start_paused = true)]
    async fn answer_ttft_judges_the_first_answer_token() {
        let file: SloFile =
            serde_yaml::from_str("slos:\n  - {name: answer, objective: 99, answer_ttft: 2s}\n").unwrap();
        let set = SloSet::validate(None, None, Some(1), file).unwrap();
        let slo = &set.slos[0];
        let mut reasoned = request(Outcome::Success, 300, 10);
        reasoned.answer_ttft = Some(Duration::from_millis(2500));
        assert_eq!(
            classify(slo, &reasoned),
            Verdict::Bad,
            "a long reasoning before the answer"
        );
        reasoned.answer_ttft = Some(Duration::from_secs(2));
        assert_eq!(classify(slo, &reasoned), Verdict::Good);
        reasoned.answer_ttft = None;
        assert_eq!(
            classify(slo, &reasoned),
            Verdict::NotCounted,
            "a tool call alone has no answer token"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reload_keeps_the_history_of_slos_that_stay() {
        let engine = engine();
        send(&engine, 50, &request(Outcome::UpstreamError, 1, 1));
        let file: SloFile =
            serde_yaml::from_str("slos:\n  - {name: avail, objective: 99, availability: true}\n").unwrap();
        engine.reload(SloSet::validate(Some("chat".into()), None, Some(20), file).unwrap());
        let s = engine.snapshot(Instant::now());
        assert!(
            close(burn(&s, "avail", "5m"), 100.0),
            "ratio 1.0 over the new budget 0.01"
        );
        assert!(
            s.error_ratio.iter().all(|(l, _, _)| l.slo == "avail"),
            "removed SLOs are gone"
        );
    }
}
