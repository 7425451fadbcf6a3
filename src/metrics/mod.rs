//! The Prometheus registry: the families, per-request recording, and encoding.

pub mod buckets;
pub mod classic_text;
pub mod config_status;
pub mod labels;
pub mod native;
mod order;
pub mod phases;
pub mod server;

use crate::capacity::meter::InFlight;
use crate::capacity::CapacityEngine;
use crate::engine::{EngineCollector, EngineMetricsMode, EngineView};
use crate::gpu::{GpuCollector, GpuState};
use crate::otel::metrics::{Boundaries, OtelMetrics, OtlpGaps};
use crate::provider::Provider;
use crate::record::CountSource;
use crate::record::Engine;
use crate::record::Operation;
use crate::record::UnmeasuredReason;
use crate::record::{Outcome, RequestRecord};
use crate::slo::spec::{SloKind, SloSet};
use crate::slo::SloEngine;
use buckets::{BucketOverrides, Buckets};
use labels::{
    BuildLabels, ClientTimeoutLabels, CountSourceLabels, ExemplarLabels, InFlightLabels, ModelNames, OutcomeLabels,
    RefusalLabels, RequestLabels, TokenLabels, UnmeasuredLabels,
};
pub use labels::{ClientTimeout, RefusalReason};
use native::{ClassicAndNative, ExemplarHistograms};
use opentelemetry::metrics::Meter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::info;

/// The content type `/metrics` is served with.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the metrics need from the configuration.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// The configured engine (the `provider` label); `None` learns it.
    pub engine: Option<Engine>,
    /// Model allow-list; empty means learn up to `max_models`.
    pub models: Vec<String>,
    /// How many distinct models are learned before the rest become `other`.
    pub max_models: usize,
    /// Per-family bucket overrides.
    pub buckets: BucketOverrides,
    /// The SLOs judged live; their latency thresholds become exact bucket edges.
    pub slos: SloSet,
    /// How far back the live capacity model looks (`capacity.window`).
    pub capacity_window: Duration,
    /// What is done with the engine's own `/metrics` (`engine_metrics`).
    pub engine_metrics: EngineMetricsMode,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            engine: None,
            models: Vec::new(),
            max_models: crate::config::defaults::MAX_MODELS,
            buckets: BucketOverrides::default(),
            slos: SloSet::default(),
            capacity_window: crate::capacity::DEFAULT_WINDOW,
            engine_metrics: EngineMetricsMode::default(),
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, ClassicAndNative>;
/// A latency family whose buckets each keep the trace of their latest sampled observation.
type ExemplarFamily<L> = ExemplarHistograms<L, ExemplarLabels>;

/// All request-level metric families, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// The native buckets of the families with exemplars (see [`native`]).
    twins: Registry,
    provider: Provider,
    models: ModelNames,
    ttft: ExemplarFamily<RequestLabels>,
    answer_ttft: ExemplarFamily<RequestLabels>,
    tpot: ExemplarFamily<RequestLabels>,
    inter_chunk: HistogramFamily<RequestLabels>,
    tokens_per_chunk: HistogramFamily<RequestLabels>,
    duration: ExemplarFamily<OutcomeLabels>,
    token_usage: HistogramFamily<TokenLabels>,
    phases: phases::EnginePhases,
    requests: Family<OutcomeLabels, Counter>,
    output_tokens: Family<RequestLabels, Counter>,
    input_tokens: Family<RequestLabels, Counter>,
    reasoning_tokens: Family<RequestLabels, Counter>,
    in_flight: Family<InFlightLabels, Gauge>,
    refused: Family<RefusalLabels, Counter>,
    client_timeouts: Family<ClientTimeoutLabels, Counter>,
    engine_fields_unreadable: Counter,
    count_sources: Family<CountSourceLabels, Counter>,
    unmeasured: Family<UnmeasuredLabels, Counter>,
    open_connections: Gauge,
    /// `/metrics` answers given so far (for the final scrape at shutdown).
    scrapes: tokio::sync::watch::Sender<u64>,
    config_status: config_status::ConfigStatus,
    slo: Arc<SloEngine>,
    capacity: Arc<CapacityEngine>,
    /// The engine's own `/metrics`, as last read.
    engine_view: Arc<EngineView>,
    /// The histograms' edges, for the OTLP instruments.
    boundaries: Boundaries,
    /// The same records as OTLP instruments, when metric export is on.
    otlp: Option<OtelMetrics>,
    /// Every finished request's record, exact, for whoever subscribed (the demo's table).
    records: tokio::sync::broadcast::Sender<RequestRecord>,
}

/// Records a subscriber may fall behind by before it loses the oldest.
const RECORD_BACKLOG: usize = 4096;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

/// Handles resolved once when a request starts, used while its response streams.
#[derive(Debug)]
pub struct RequestHandles {
    /// The request's normalised model.
    pub model: String,
    /// A model name the request named that is not known yet: learned on a successful answer.
    pub candidate: Option<String>,
    /// The request's operation.
    pub operation: Operation,
    /// Inter-chunk latency histogram(s) for this request's labels.
    pub inter_chunk: GapRecorder,
    /// The request counted in its model's load meter (generation requests only: pooling
    /// work does not run on the decode loop).
    pub load: Option<InFlight>,
    _in_flight: GaugeGuard,
}

/// Where one request's inter-chunk gaps are observed: its Prometheus series and, when metric
/// export is on, its OTLP instrument.
#[derive(Debug, Clone)]
pub struct GapRecorder {
    prometheus: Histogram,
    otlp: Option<OtlpGaps>,
}

impl GapRecorder {
    /// Observes one gap, in seconds.
    pub fn observe(&self, seconds: f64) {
        self.prometheus.observe(seconds);
        if let Some(otlp) = &self.otlp {
            otlp.record(seconds);
        }
    }
}

/// The generation APIs `engine` serves, whose series are created at zero for every known
/// model. TGI has no Responses or Messages API; the other engines serve chat, completions
/// and both (vLLM and SGLang natively; llama.cpp the Messages API). Non-generation routes get
/// their series on first use.
fn served_generation(engine: Engine) -> &'static [Operation] {
    match engine {
        Engine::Tgi => &[Operation::Chat, Operation::TextCompletion, Operation::Generate],
        _ => &[
            Operation::Chat,
            Operation::TextCompletion,
            Operation::Responses,
            Operation::Messages,
        ],
    }
}

/// Counts one in a gauge for as long as it lives: a request in flight, an open connection.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Increments `gauge` now; the drop decrements it.
    pub fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    /// Builds and registers every family, pre-creating series for configured models.
    pub fn new(config: &MetricsConfig) -> Self {
        let b = &config.buckets;
        let slos = &config.slos;
        let ttft_edges = slos.thresholds(|k| if let SloKind::Ttft(d) = k { Some(d) } else { None });
        let answer_edges = slos.thresholds(|k| if let SloKind::AnswerTtft(d) = k { Some(d) } else { None });
        let tpot_edges = slos.thresholds(|k| if let SloKind::Tpot(d) = k { Some(d) } else { None });
        let e2e_edges = slos.thresholds(|k| if let SloKind::E2e(d) = k { Some(d) } else { None });
        let boundaries = Boundaries {
            ttft: Buckets::new(b.ttft.as_ref(), buckets::TTFT, &ttft_edges)
                .edges()
                .to_vec(),
            answer_ttft: Buckets::new(b.ttft.as_ref(), buckets::TTFT, &answer_edges)
                .edges()
                .to_vec(),
            tpot: Buckets::new(b.tpot.as_ref(), buckets::TPOT, &tpot_edges)
                .edges()
                .to_vec(),
            e2e: Buckets::new(b.e2e.as_ref(), buckets::E2E, &e2e_edges).edges().to_vec(),
            tokens: Buckets::new(b.tokens.as_ref(), buckets::TOKENS, &[]).edges().to_vec(),
            inter_chunk: Buckets::new(b.tpot.as_ref(), buckets::TPOT, &[]).edges().to_vec(),
            tokens_per_chunk: Buckets::new(b.tokens_per_chunk.as_ref(), buckets::TOKENS_PER_CHUNK, &[])
                .edges()
                .to_vec(),
            phases: Buckets::new(b.ttft.as_ref(), buckets::TTFT, &[]).edges().to_vec(),
            engine_tpot: Buckets::new(b.tpot.as_ref(), buckets::TPOT, &[]).edges().to_vec(),
        };
        let mut registry = Registry::default();
        let slo = SloEngine::new(slos.clone(), &mut registry);
        let capacity = CapacityEngine::new(config.capacity_window, slo.clone(), &mut registry);
        let engine_view = EngineView::new(config.engine_metrics);
        registry.register_collector(Box::new(EngineCollector(engine_view.clone())));
        let metrics = Self {
            registry,
            twins: Registry::default(),
            provider: Provider::new(config.engine),
            models: ModelNames::new(&config.models, config.max_models),
            ttft: ExemplarHistograms::new(Buckets::new(b.ttft.as_ref(), buckets::TTFT, &ttft_edges)),
            answer_ttft: ExemplarHistograms::new(Buckets::new(b.ttft.as_ref(), buckets::TTFT, &answer_edges)),
            tpot: ExemplarHistograms::new(Buckets::new(b.tpot.as_ref(), buckets::TPOT, &tpot_edges)),
            inter_chunk: Family::new_with_constructor(ClassicAndNative(Buckets::new(
                b.tpot.as_ref(),
                buckets::TPOT,
                &[],
            ))),
            tokens_per_chunk: Family::new_with_constructor(ClassicAndNative(Buckets::new(
                b.tokens_per_chunk.as_ref(),
                buckets::TOKENS_PER_CHUNK,
                &[],
            ))),
            duration: ExemplarHistograms::new(Buckets::new(b.e2e.as_ref(), buckets::E2E, &e2e_edges)),
            token_usage: Family::new_with_constructor(ClassicAndNative(Buckets::new(
                b.tokens.as_ref(),
                buckets::TOKENS,
                &[],
            ))),
            phases: phases::EnginePhases::new(b),
            requests: Family::default(),
            output_tokens: Family::default(),
            input_tokens: Family::default(),
            reasoning_tokens: Family::default(),
            in_flight: Family::default(),
            refused: Family::default(),
            client_timeouts: Family::default(),
            engine_fields_unreadable: Counter::default(),
            count_sources: Family::default(),
            unmeasured: Family::default(),
            open_connections: Gauge::default(),
            scrapes: tokio::sync::watch::Sender::new(0),
            records: tokio::sync::broadcast::channel(RECORD_BACKLOG).0,
            config_status: config_status::ConfigStatus::new(true),
            slo,
            capacity,
            engine_view,
            boundaries,
            otlp: None,
        };
        let metrics = metrics.registered();
        metrics.create_known_series();
        metrics
    }

    /// Records every request into `meter`'s instruments too (before the registry is shared).
    pub fn export_otlp(&mut self, meter: &Meter) {
        self.otlp = Some(OtelMetrics::new(meter, self.boundaries.clone()));
    }

    /// Adds the GPU collector (before the registry is shared).
    pub fn register_gpu(&mut self, state: Arc<GpuState>) {
        self.registry.register_collector(Box::new(GpuCollector(state)));
    }

    /// Puts new SLOs in force (hot reload); counters keep counting.
    pub fn reload_slos(&self, set: SloSet) {
        self.slo.reload(set);
        self.create_known_series();
    }

    /// The engine, when configured or learned.
    pub fn engine(&self) -> Option<Engine> {
        self.provider.engine()
    }

    /// The `provider` label value now.
    pub fn provider(&self) -> &'static str {
        self.provider.label()
    }

    /// Records the engine `auto` learned; the known models' series are created under it.
    pub fn learn_engine(&self, engine: Engine) {
        if self.provider.learn(engine) {
            info!(provider = engine.as_str(), "identified the engine");
            self.create_known_series();
        }
    }

    /// Learns the models the engine serves (when no allow-list is configured), so their
    /// series exist at zero before the first request; the only one names model-less requests.
    pub fn learn_models(&self, ids: &[String]) {
        self.models.set_served(ids);
        for id in ids {
            let (model, first_seen) = self.models.learn(id);
            if first_seen {
                self.create_series(&model);
            }
        }
    }

    fn create_known_series(&self) {
        for model in self.models.known() {
            self.create_series(&model);
        }
    }

    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        let twins = &mut self.twins;
        self.ttft.register(
            r,
            twins,
            "gen_ai_server_time_to_first_token",
            "Time from the request head reaching llmslo to the first generated token forwarded to the client",
            Unit::Seconds,
        );
        self.answer_ttft.register(
            r,
            twins,
            "llmslo_time_to_first_answer_token",
            "Time from the request head reaching llmslo to the first token of the answer itself (after any \
             reasoning; tool-call arguments are not the answer) forwarded to the client",
            Unit::Seconds,
        );
        self.tpot.register(
            r,
            twins,
            "gen_ai_server_time_per_output_token",
            "Time per output token after the first: (t_last - t_first) / (N - 1)",
            Unit::Seconds,
        );
        self.duration.register(
            r,
            twins,
            "gen_ai_server_request_duration",
            "Time from the request head to the end of the response (or its abort)",
            Unit::Seconds,
        );
        r.register(
            "gen_ai_client_token_usage",
            "Tokens per request, by token_type (input from usage, output from usage or counted)",
            self.token_usage.clone(),
        );
        r.register_with_unit(
            "llmslo_inter_chunk_latency",
            "Gap between consecutive token-carrying stream events",
            Unit::Seconds,
            self.inter_chunk.clone(),
        );
        r.register(
            "llmslo_tokens_per_chunk",
            "Mean output tokens per token-carrying stream event, one observation per request",
            self.tokens_per_chunk.clone(),
        );
        self.phases.register(r);
        r.register("llmslo_requests", "Measured requests by outcome", self.requests.clone());
        r.register(
            "llmslo_output_tokens",
            "Output tokens generated",
            self.output_tokens.clone(),
        );
        r.register(
            "llmslo_input_tokens",
            "Input (prompt) tokens reported by the engine",
            self.input_tokens.clone(),
        );
        r.register(
            "llmslo_reasoning_tokens",
            "Output tokens spent on reasoning, where the engine's usage reports them (part of llmslo_output_tokens)",
            self.reasoning_tokens.clone(),
        );
        r.register(
            "llmslo_requests_in_flight",
            "Measured requests whose response has not ended",
            self.in_flight.clone(),
        );
        r.register(
            "llmslo_requests_refused",
            "Requests and connections the sidecar refused to protect itself, by the limit reached \
             (never forwarded, never counted for or against an SLO)",
            self.refused.clone(),
        );
        for reason in RefusalReason::ALL {
            drop(self.refused.get_or_create(&RefusalLabels { reason }));
        }
        r.register(
            "llmslo_client_timeouts",
            "Clients cut off by a deadline that only their progress renews, by the config key of the \
             deadline: what they held (a connection, an in-flight slot, buffered bytes, an HTTP/2 stream) \
             was freed and the engine's request cancelled",
            self.client_timeouts.clone(),
        );
        for timeout in ClientTimeout::ALL {
            drop(self.client_timeouts.get_or_create(&ClientTimeoutLabels { timeout }));
        }
        r.register(
            "llmslo_engine_request_metrics_unreadable_fields",
            "Fields of the engine's per-request metrics that could not be read (not a number, not finite, \
             out of range): each is left out on its own, and the rest of its answer is read",
            self.engine_fields_unreadable.clone(),
        );
        r.register(
            "llmslo_token_count_source",
            "Streamed responses by where their output token count came from: usage, token_ids \
             (stated per event), tokenizer, or events (several tokens may share an event: the \
             count and TPOT are unknown)",
            self.count_sources.clone(),
        );
        for source in CountSource::ALL {
            drop(self.count_sources.get_or_create(&CountSourceLabels { source }));
        }
        r.register(
            "llmslo_unmeasured_responses",
            "Successful responses llmslo forwarded but could not measure, by reason (their outcome \
             still counts; their latency and tokens are unknown)",
            self.unmeasured.clone(),
        );
        for reason in UnmeasuredReason::ALL {
            drop(self.unmeasured.get_or_create(&UnmeasuredLabels { reason }));
        }
        r.register(
            "llmslo_proxy_connections_open",
            "Client connections open on the proxy port",
            self.open_connections.clone(),
        );
        self.config_status.register(r);
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register("llmslo_build_info", "llmslo build information", build_info);
        self
    }

    /// Creates every series of `model` at zero, so dashboards and alerts never miss one
    /// (once the engine is known, so that no `provider="unknown"` series linger).
    fn create_series(&self, model: &str) {
        self.slo.create_series(model);
        let Some(engine) = self.provider.engine() else {
            return;
        };
        for &operation in served_generation(engine) {
            let labels = self.request_labels(model, operation);
            for family in [&self.ttft, &self.answer_ttft, &self.tpot] {
                family.create(&labels);
            }
            for family in [&self.inter_chunk, &self.tokens_per_chunk] {
                drop(family.get_or_create(&labels));
            }
            drop(self.output_tokens.get_or_create(&labels));
            drop(self.input_tokens.get_or_create(&labels));
            drop(self.reasoning_tokens.get_or_create(&labels));
            for token_type in ["input", "output"] {
                drop(self.token_usage.get_or_create(&self.token_labels(&labels, token_type)));
            }
            drop(self.in_flight.get_or_create(&InFlightLabels {
                model: model.to_string(),
                operation,
            }));
            for outcome in Outcome::ALL {
                let labels = self.outcome_labels(&labels, outcome);
                drop(self.requests.get_or_create(&labels));
                self.duration.create(&labels);
            }
        }
    }

    /// Starts measuring a request that arrived at `now`: labels its model (a name not known
    /// yet is `other` until the engine answers it successfully) and counts it in flight.
    pub fn start_request(&self, raw_model: Option<&str>, operation: Operation, now: Instant) -> RequestHandles {
        let (model, candidate) = self.models.label(raw_model);
        let (in_flight, inter_chunk) = self.request_series(&model, operation);
        RequestHandles {
            load: operation.is_generation().then(|| self.capacity.arrive(now)),
            model,
            candidate,
            operation,
            inter_chunk,
            _in_flight: in_flight,
        }
    }

    /// The engine answered the request successfully: a model name it named that was not known
    /// yet is learned (within `max_models`), and the request is labelled with it from now on.
    pub fn confirm_model(&self, handles: &mut RequestHandles) {
        let Some(candidate) = handles.candidate.take() else {
            return;
        };
        let (model, first_seen) = self.models.learn(&candidate);
        if first_seen {
            self.create_series(&model);
        }
        if model != handles.model {
            // The load meter is the engine's: the request stays counted as it arrived.
            let (in_flight, inter_chunk) = self.request_series(&model, handles.operation);
            handles.model = model;
            handles.inter_chunk = inter_chunk;
            handles._in_flight = in_flight;
        }
    }

    /// The in-flight count and inter-chunk histogram(s) of a request labelled `model`.
    fn request_series(&self, model: &str, operation: Operation) -> (GaugeGuard, GapRecorder) {
        let gauge = self
            .in_flight
            .get_or_create(&InFlightLabels {
                model: model.to_string(),
                operation,
            })
            .clone();
        let inter_chunk = GapRecorder {
            prometheus: self
                .inter_chunk
                .get_or_create(&self.request_labels(model, operation))
                .clone(),
            otlp: self
                .otlp
                .as_ref()
                .map(|otlp| otlp.gap_recorder(model, operation, self.provider())),
        };
        (GaugeGuard::new(gauge), inter_chunk)
    }

    /// Whether the config file is in force (`llmslo_config_valid` and its reload gauges).
    pub fn config_status(&self) -> &config_status::ConfigStatus {
        &self.config_status
    }

    /// Counts work refused because a sidecar limit was reached.
    pub fn count_refused(&self, reason: RefusalReason) {
        self.refused.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// Notes one `/metrics` answer encoded.
    pub fn count_scrape(&self) {
        self.scrapes.send_modify(|n| *n += 1);
    }

    /// How many `/metrics` answers have been encoded, as it changes.
    pub fn scrapes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.scrapes.subscribe()
    }

    /// Counts a client cut off by one of its deadlines.
    pub fn count_client_timeout(&self, timeout: ClientTimeout) {
        self.client_timeouts
            .get_or_create(&ClientTimeoutLabels { timeout })
            .inc();
    }

    /// Counts a response that could not be measured.
    pub fn count_unmeasured(&self, reason: UnmeasuredReason) {
        self.unmeasured.get_or_create(&UnmeasuredLabels { reason }).inc();
    }

    /// Counts one client connection open on the proxy port, until the guard is dropped.
    pub fn connection_opened(&self) -> GaugeGuard {
        GaugeGuard::new(self.open_connections.clone())
    }

    /// Every request's record from now on, exact (not bucketed). A subscriber that falls more
    /// than 4096 records behind loses the oldest; with none, nothing is copied.
    pub fn subscribe_records(&self) -> tokio::sync::broadcast::Receiver<RequestRecord> {
        self.records.subscribe()
    }

    /// Records a finished request into every family it touches.
    pub fn record(&self, record: &RequestRecord) {
        if self.records.receiver_count() > 0 {
            let _ = self.records.send(record.clone());
        }
        let labels = self.request_labels(&record.model, record.operation);
        let exemplar = record.trace.map(ExemplarLabels::from);
        if let Some(ttft) = record.ttft {
            self.ttft.observe(&labels, ttft.as_secs_f64(), exemplar.clone());
        }
        if let Some(answer) = record.answer_ttft {
            self.answer_ttft
                .observe(&labels, answer.as_secs_f64(), exemplar.clone());
        }
        if let Some(timing) = record.engine {
            self.phases.observe(&labels, timing, record.ttft);
            if timing.unreadable > 0 {
                self.engine_fields_unreadable.inc_by(u64::from(timing.unreadable));
            }
        }
        if let Some(waiting) = record.engine_context.and_then(|c| c.waiting_at_arrival) {
            self.phases.observe_waiting(&labels, waiting);
        }
        if let Some(n) = record.reasoning_tokens {
            self.reasoning_tokens.get_or_create(&labels).inc_by(n);
        }
        for tpot in &record.tpot_per_choice {
            self.tpot.observe(&labels, tpot.as_secs_f64(), exemplar.clone());
        }
        if let Some(mean) = record.tokens_per_chunk() {
            self.tokens_per_chunk.get_or_create(&labels).observe(mean);
        }
        if let Some(n) = record.output_tokens {
            self.output_tokens.get_or_create(&labels).inc_by(n);
            self.token_usage
                .get_or_create(&self.token_labels(&labels, "output"))
                .observe(n as f64);
        }
        if let Some(n) = record.input_tokens {
            self.input_tokens.get_or_create(&labels).inc_by(n);
            self.token_usage
                .get_or_create(&self.token_labels(&labels, "input"))
                .observe(n as f64);
        }
        if let Some(source) = record.count_source {
            self.count_sources.get_or_create(&CountSourceLabels { source }).inc();
        }
        let labels = self.outcome_labels(&labels, record.outcome);
        self.requests.get_or_create(&labels).inc();
        self.duration.observe(&labels, record.e2e.as_secs_f64(), exemplar);
        self.slo.record(record, || self.capacity.decode_fit());
        self.capacity.record(record);
        if let Some(otlp) = &self.otlp {
            otlp.record(record, self.provider());
        }
    }

    /// The engine's own `/metrics`, as last read (for the scraper and the requests).
    pub fn engine_view(&self) -> &Arc<EngineView> {
        &self.engine_view
    }

    /// The whole registry in the OpenMetrics text format, each family's series in label order;
    /// with `engine_metrics: merge`, the engine's families follow llmslo's.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        let mut out = order::sorted(&out);
        if self.engine_view.mode() == EngineMetricsMode::Merge {
            let engine = self.engine_view.merged_families(&out);
            if let Some(end) = out.strip_suffix("# EOF\n").map(str::len) {
                out.truncate(end);
                out.push_str(&engine);
                out.push_str("# EOF\n");
            }
        }
        out
    }

    /// The whole registry in Prometheus's protobuf exposition, every histogram with its native
    /// buckets as well as its classic ones; with `engine_metrics: merge`, the engine's families
    /// follow llmslo's.
    pub fn encode_protobuf(&self) -> Vec<u8> {
        native::encode_protobuf(&self.registry, &self.twins, |own| {
            self.engine_view.merged_protobuf(own.iter().map(String::as_str))
        })
    }

    fn request_labels(&self, model: &str, operation: Operation) -> RequestLabels {
        RequestLabels {
            model: model.to_string(),
            operation,
            provider: self.provider.label().to_string(),
        }
    }

    fn outcome_labels(&self, labels: &RequestLabels, outcome: Outcome) -> OutcomeLabels {
        OutcomeLabels {
            model: labels.model.clone(),
            operation: labels.operation,
            provider: labels.provider.clone(),
            outcome,
        }
    }

    fn token_labels(&self, labels: &RequestLabels, token_type: &'static str) -> TokenLabels {
        TokenLabels {
            model: labels.model.clone(),
            operation: labels.operation,
            provider: labels.provider.clone(),
            token_type,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(models: &[&str]) -> Metrics {
        Metrics::new(&MetricsConfig {
            engine: Some(Engine::Vllm),
            models: models.iter().map(|m| m.to_string()).collect(),
            max_models: 16,
            ..MetricsConfig::default()
        })
    }

    #[test]
    fn configured_models_are_pre_created_at_zero() {
        let text = metrics(&["llama"]).encode();
        assert!(text.contains(
            "llmslo_requests_total{model=\"llama\",operation=\"chat\",provider=\"vllm\",outcome=\"upstream_error\"} 0"
        ));
        assert!(text.contains(
            "gen_ai_server_time_per_output_token_seconds_count{model=\"llama\",operation=\"text_completion\",provider=\"vllm\"} 0"
        ));
        assert!(text.contains("llmslo_build_info{version=\"0.1.0\"} 1"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_record_lands_in_every_family() {
        let m = metrics(&[]);
        let mut handles = m.start_request(Some("llama"), Operation::Chat, Instant::now());
        assert_eq!(handles.model, "other", "not learned from the request alone");
        m.confirm_model(&mut handles);
        assert_eq!(handles.model, "llama", "learned from the engine's successful answer");
        assert!(m
            .encode()
            .contains("llmslo_requests_in_flight{model=\"other\",operation=\"chat\"} 0"));
        assert!(m
            .encode()
            .contains("llmslo_requests_in_flight{model=\"llama\",operation=\"chat\"} 1"));
        m.record(&RequestRecord {
            model: handles.model.clone(),
            operation: Operation::Chat,
            outcome: Outcome::Success,
            ttft: Some(Duration::from_millis(120)),
            answer_ttft: Some(Duration::from_millis(120)),
            tpot_per_choice: vec![Duration::from_millis(20)],
            e2e: Duration::from_millis(500),
            output_tokens: Some(21),
            input_tokens: Some(7),
            reasoning_tokens: None,
            token_events: 7,
            count_source: None,
            load: None,
            engine: None,
            engine_context: None,
            trace: None,
            provider: None,
            unmeasured: None,
        });
        drop(handles);
        let text = m.encode();
        let l = "model=\"llama\",operation=\"chat\",provider=\"vllm\"";
        for line in [
            format!("gen_ai_server_time_to_first_token_seconds_sum{{{l}}} 0.12"),
            format!("gen_ai_server_time_to_first_token_seconds_bucket{{le=\"0.25\",{l}}} 1"),
            format!("gen_ai_server_time_to_first_token_seconds_bucket{{le=\"0.1\",{l}}} 0"),
            format!("gen_ai_server_time_per_output_token_seconds_sum{{{l}}} 0.02"),
            format!("llmslo_tokens_per_chunk_sum{{{l}}} 3.0"),
            format!("llmslo_output_tokens_total{{{l}}} 21"),
            format!("llmslo_input_tokens_total{{{l}}} 7"),
            format!("gen_ai_client_token_usage_sum{{{l},token_type=\"output\"}} 21.0"),
            format!("llmslo_requests_total{{{l},outcome=\"success\"}} 1"),
            format!("gen_ai_server_request_duration_seconds_count{{{l},outcome=\"success\"}} 1"),
            "llmslo_requests_in_flight{model=\"llama\",operation=\"chat\"} 0".to_string(),
        ] {
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
    }

    /// `bytes` as Prometheus's length-delimited `MetricFamily` messages.
    fn decode(mut bytes: &[u8]) -> Vec<crate::proto::MetricFamily> {
        use prost::Message;
        let mut families = Vec::new();
        while !bytes.is_empty() {
            families.push(crate::proto::MetricFamily::decode_length_delimited(&mut bytes).unwrap());
        }
        families
    }

    #[test]
    fn protobuf_carries_every_family_and_native_buckets_beside_the_classic_ones() {
        let m = metrics(&["llama"]);
        let trace = crate::record::TraceRef {
            trace_id: opentelemetry::trace::TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            span_id: opentelemetry::trace::SpanId::from_hex("b7ad6b7169203331").unwrap(),
        };
        for ms in [20, 30, 30, 45] {
            m.record(&RequestRecord {
                model: "llama".into(),
                operation: Operation::Chat,
                outcome: Outcome::Success,
                ttft: Some(Duration::from_millis(5 * ms)),
                answer_ttft: None,
                tpot_per_choice: vec![Duration::from_millis(ms)],
                e2e: Duration::from_millis(40 * ms),
                output_tokens: Some(40),
                input_tokens: Some(7),
                reasoning_tokens: None,
                token_events: 40,
                count_source: None,
                load: None,
                engine: None,
                engine_context: None,
                trace: Some(trace),
                provider: None,
                unmeasured: None,
            });
        }
        let families = decode(&m.encode_protobuf());
        let text = m.encode();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut words = line.split(' ').skip(2);
            let (name, kind) = (words.next().unwrap(), words.next().unwrap());
            let name = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            assert!(
                families.iter().any(|f| f.name == name),
                "{name} is in the protobuf exposition too"
            );
        }
        let histograms = families
            .iter()
            .filter(|f| f.r#type == crate::proto::MetricType::Histogram as i32);
        let mut checked = 0;
        for family in histograms {
            for metric in &family.metric {
                let h = metric.histogram.as_ref().unwrap();
                assert_eq!(h.schema, i32::from(native::SCHEMA), "{}", family.name);
                assert!(h.zero_threshold > 0.0, "marks the histogram native even while empty");
                assert!(!h.bucket.is_empty(), "{} keeps its classic buckets", family.name);
                let native_count = h.zero_count
                    + h.positive_delta
                        .iter()
                        .scan(0, |c, d| {
                            *c += d;
                            Some(*c as u64)
                        })
                        .sum::<u64>();
                assert_eq!(
                    native_count, h.sample_count,
                    "{}: buckets agree with the count",
                    family.name
                );
                assert_eq!(h.bucket.last().unwrap().cumulative_count, h.sample_count);
                checked += usize::from(h.sample_count > 0);
            }
        }
        assert!(checked >= 6, "every populated histogram was checked: {checked}");
        let tpot = families
            .iter()
            .find(|f| f.name == "gen_ai_server_time_per_output_token_seconds")
            .unwrap();
        let series = tpot
            .metric
            .iter()
            .find(|s| s.label.iter().any(|l| l.name == "operation" && l.value == "chat"))
            .unwrap();
        let h = series.histogram.as_ref().unwrap();
        assert_eq!((h.sample_count, h.sample_sum), (4, 0.125));
        assert_eq!(h.positive_delta.len(), 3, "20, 30 and 45 ms in three native buckets");
        let exemplar = h.bucket.iter().find_map(|b| b.exemplar.as_ref()).expect("an exemplar");
        assert!(exemplar
            .label
            .iter()
            .any(|l| l.name == "trace_id" && l.value == "0af7651916cd43dd8448eb211c80319c"));
    }
}
