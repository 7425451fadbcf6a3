//! The Prometheus families of the request path, as one reader of the request record: latency
//! (TTFT, time to first answer token, TPOT, inter-chunk gaps, end to end), tokens, the engine's
//! own phases, outcomes, what is in flight, how counts were made and what went unmeasured;
//! beside them the counters of the sidecar's own limits ([`LimitCounters`]), which the proxy
//! and the accept loop count into.

use super::buckets::{self, BucketOverrides, Buckets};
use super::labels::{
    ClientTimeoutLabels, CountSourceLabels, ExemplarLabels, InFlightLabels, OutcomeLabels, RefusalLabels,
    RequestLabels, TenantOutcomeLabels, TenantRequestLabels, TenantSourceLabels, TokenLabels, TpotBasisLabels,
    UnmeasuredLabels,
};
use super::limits::{GaugeGuard, LimitCounters};
use super::native::{ClassicAndNative, ExemplarHistograms};
use super::{phases, ClientTimeout, RefusalReason, Registry};
use crate::record::{
    CountSource, Engine, LabelText, Ongoing, Operation, Outcome, Reader, RequestRecord, Started, TenantSource,
    TpotBasis, UnmeasuredReason,
};
use crate::slo::spec::{SloKind, SloSet};
use crate::tenant::TenantLabel;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};

type HistogramFamily<L> = Family<L, Histogram, ClassicAndNative>;
/// A latency family whose buckets each keep the trace of their latest sampled observation.
type ExemplarFamily<L> = ExemplarHistograms<L, ExemplarLabels>;

/// The bucket edges of every request histogram: the configured (or default) edges, with each
/// SLO's latency threshold added as an exact edge.
#[derive(Debug, Clone)]
pub struct Edges {
    /// TTFT, seconds.
    pub ttft: Buckets,
    /// Time to first answer token, seconds.
    pub answer_ttft: Buckets,
    /// TPOT, seconds.
    pub tpot: Buckets,
    /// End to end, seconds.
    pub e2e: Buckets,
    /// Tokens per request.
    pub tokens: Buckets,
    /// Inter-chunk gaps, seconds.
    pub inter_chunk: Buckets,
    /// Tokens per chunk.
    pub tokens_per_chunk: Buckets,
    /// The engine's phases, seconds.
    pub phases: Buckets,
    /// The engine's TPOT, seconds.
    pub engine_tpot: Buckets,
}

impl Edges {
    /// The edges `overrides` and the thresholds of `slos` give.
    pub fn new(b: &BucketOverrides, slos: &SloSet) -> Self {
        let ttft_edges = slos.thresholds(|k| if let SloKind::Ttft(d) = k { Some(d) } else { None });
        let answer_edges = slos.thresholds(|k| if let SloKind::AnswerTtft(d) = k { Some(d) } else { None });
        let tpot_edges = slos.thresholds(|k| if let SloKind::Tpot(d) = k { Some(d) } else { None });
        let e2e_edges = slos.thresholds(|k| if let SloKind::E2e(d) = k { Some(d) } else { None });
        Self {
            ttft: Buckets::new(b.ttft.as_ref(), buckets::TTFT, &ttft_edges),
            answer_ttft: Buckets::new(b.ttft.as_ref(), buckets::TTFT, &answer_edges),
            tpot: Buckets::new(b.tpot.as_ref(), buckets::TPOT, &tpot_edges),
            e2e: Buckets::new(b.e2e.as_ref(), buckets::E2E, &e2e_edges),
            tokens: Buckets::new(b.tokens.as_ref(), buckets::TOKENS, &[]),
            inter_chunk: Buckets::new(b.tpot.as_ref(), buckets::TPOT, &[]),
            tokens_per_chunk: Buckets::new(b.tokens_per_chunk.as_ref(), buckets::TOKENS_PER_CHUNK, &[]),
            phases: Buckets::new(b.ttft.as_ref(), buckets::TTFT, &[]),
            engine_tpot: Buckets::new(b.tpot.as_ref(), buckets::TPOT, &[]),
        }
    }
}

/// The request path's families.
#[derive(Debug)]
pub struct RequestFamilies {
    ttft: ExemplarFamily<RequestLabels>,
    answer_ttft: ExemplarFamily<RequestLabels>,
    tpot: ExemplarFamily<RequestLabels>,
    inter_chunk: HistogramFamily<RequestLabels>,
    tokens_per_chunk: HistogramFamily<RequestLabels>,
    duration: ExemplarFamily<RequestLabels>,
    token_usage: HistogramFamily<TokenLabels>,
    phases: phases::EnginePhases,
    requests: Family<TenantOutcomeLabels, Counter>,
    output_tokens: Family<TenantRequestLabels, Counter>,
    input_tokens: Family<TenantRequestLabels, Counter>,
    reasoning_tokens: Family<TenantRequestLabels, Counter>,
    in_flight: Family<InFlightLabels, Gauge>,
    limits: LimitCounters,
    engine_fields_unreadable: Counter,
    engine_fields_inconsistent: Counter,
    count_sources: Family<CountSourceLabels, Counter>,
    tpot_bases: Family<TpotBasisLabels, Counter>,
    unmeasured: Family<UnmeasuredLabels, Counter>,
    /// The tenant labels whose series are created at zero: `[None]` without tenants.
    tenants: Vec<TenantLabel>,
    /// Where requests' tenants were read from (registered only with tenants).
    tenant_sources: Family<TenantSourceLabels, Counter>,
    /// The models and APIs whose series exist (created when the first request of each starts,
    /// or ends): where a forgotten tenant's series are.
    operations: RwLock<HashSet<RequestLabels>>,
}

/// One request's part in the families while it runs: it counts in flight, and its gaps go to
/// its inter-chunk series.
#[derive(Debug)]
struct InFlightRequest {
    inter_chunk: Histogram,
    _in_flight: GaugeGuard,
}

impl Ongoing for InFlightRequest {
    fn gap(&self, seconds: f64) {
        self.inter_chunk.observe(seconds);
    }
}

impl RequestFamilies {
    /// Builds the families with `edges` and registers them (and the limit counters) in
    /// `registry`; with `tenants` (the labels known from the start), the request and token
    /// counters carry a `tenant` label.
    pub fn new(
        edges: &Edges,
        overrides: &BucketOverrides,
        tenants: Option<Vec<LabelText>>,
        registry: &mut Registry,
    ) -> Self {
        let families = Self {
            ttft: ExemplarHistograms::new(edges.ttft.clone()),
            answer_ttft: ExemplarHistograms::new(edges.answer_ttft.clone()),
            tpot: ExemplarHistograms::new(edges.tpot.clone()),
            inter_chunk: Family::new_with_constructor(ClassicAndNative(edges.inter_chunk.clone())),
            tokens_per_chunk: Family::new_with_constructor(ClassicAndNative(edges.tokens_per_chunk.clone())),
            duration: ExemplarHistograms::new(edges.e2e.clone()),
            token_usage: Family::new_with_constructor(ClassicAndNative(edges.tokens.clone())),
            phases: phases::EnginePhases::new(overrides),
            requests: Family::default(),
            output_tokens: Family::default(),
            input_tokens: Family::default(),
            reasoning_tokens: Family::default(),
            in_flight: Family::default(),
            limits: LimitCounters::default(),
            engine_fields_unreadable: Counter::default(),
            engine_fields_inconsistent: Counter::default(),
            count_sources: Family::default(),
            tpot_bases: Family::default(),
            unmeasured: Family::default(),
            tenants: match &tenants {
                Some(known) => known.iter().map(|t| TenantLabel(Some(t.clone()))).collect(),
                None => vec![TenantLabel(None)],
            },
            tenant_sources: Family::default(),
            operations: RwLock::default(),
        };
        families.register(registry);
        if tenants.is_some() {
            registry.families.register(
                "llmslo_tenant_sources",
                "Measured requests by where their tenant was read from (header, api_key, body), or none",
                families.tenant_sources.clone(),
            );
            for source in TenantSource::ALL.map(TenantSource::as_str).into_iter().chain(["none"]) {
                drop(families.tenant_sources.get_or_create(&TenantSourceLabels { source }));
            }
        }
        families
    }

    /// The counters of the sidecar's own limits, for the proxy and the accept loop.
    pub fn limits(&self) -> LimitCounters {
        self.limits.clone()
    }

    fn register(&self, registry: &mut Registry) {
        self.ttft.register(
            registry,
            "gen_ai_server_time_to_first_token",
            "Time from the request head reaching llmslo to the first generated token forwarded to the client",
            Unit::Seconds,
        );
        self.answer_ttft.register(
            registry,
            "llmslo_time_to_first_answer_token",
            "Time from the request head reaching llmslo to the first token of the answer itself (after any \
             reasoning; tool-call arguments are not the answer) forwarded to the client",
            Unit::Seconds,
        );
        self.tpot.register(
            registry,
            "gen_ai_server_time_per_output_token",
            "Time per output token after the first: (t_last - t_first) / (N - 1)",
            Unit::Seconds,
        );
        self.duration.register(
            registry,
            "gen_ai_server_request_duration",
            "Time from the request head to the end of the response (or its abort), whatever its outcome \
             (llmslo_requests_total counts the outcomes)",
            Unit::Seconds,
        );
        let r = &mut registry.families;
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
            self.limits.refused.clone(),
        );
        for reason in RefusalReason::ALL {
            drop(self.limits.refused.get_or_create(&RefusalLabels { reason }));
        }
        r.register(
            "llmslo_client_timeouts",
            "Clients cut off by a deadline that only their progress renews, by the config key of the \
             deadline: what they held (a connection, an in-flight slot, buffered bytes, an HTTP/2 stream) \
             was freed and the engine's request cancelled",
            self.limits.client_timeouts.clone(),
        );
        for timeout in ClientTimeout::ALL {
            drop(
                self.limits
                    .client_timeouts
                    .get_or_create(&ClientTimeoutLabels { timeout }),
            );
        }
        r.register(
            "llmslo_engine_request_metrics_unreadable_fields",
            "Fields of the engine's per-request metrics that could not be read (not a number, not finite, \
             out of range): each is left out on its own, and the rest of its answer is read",
            self.engine_fields_unreadable.clone(),
        );
        r.register(
            "llmslo_engine_request_metrics_inconsistent_fields",
            "Fields of the engine's per-request metrics that contradict what llmslo measured of the same request \
             (a queue or prefill longer than its TTFT, a mean gap longer than its answer): left out, unmeasured",
            self.engine_fields_inconsistent.clone(),
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
            "llmslo_tpot_basis",
            "Requests with a TPOT by how it was known: stream (the token events' times), engine (the \
             engine's own figure for the request, where the stream held tokens back) or estimated \
             (tokens were held back without an event and nothing said when they were made)",
            self.tpot_bases.clone(),
        );
        for basis in TpotBasis::ALL {
            drop(self.tpot_bases.get_or_create(&TpotBasisLabels { basis }));
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
            self.limits.open_connections.clone(),
        );
    }

    fn request_labels(&self, model: &LabelText, operation: Operation, provider: Option<Engine>) -> RequestLabels {
        RequestLabels {
            model: model.clone(),
            operation,
            provider: Engine::label(provider),
        }
    }
}

fn outcome_labels(labels: &RequestLabels, outcome: Outcome) -> OutcomeLabels {
    OutcomeLabels {
        model: labels.model.clone(),
        operation: labels.operation,
        provider: labels.provider,
        outcome,
    }
}

fn with_tenant(labels: &RequestLabels, tenant: &TenantLabel) -> TenantRequestLabels {
    TenantRequestLabels {
        request: labels.clone(),
        tenant: tenant.clone(),
    }
}

fn token_labels(labels: &RequestLabels, token_type: &'static str) -> TokenLabels {
    TokenLabels {
        model: labels.model.clone(),
        operation: labels.operation,
        provider: labels.provider,
        token_type,
    }
}

impl RequestFamilies {
    /// Creates the series of `labels` (a model on one API) at zero, the first time a request
    /// of it starts: so that a scrape during the first request already sees them, and a fleet
    /// pays only for the APIs it serves.
    fn operation_seen(&self, labels: &RequestLabels) {
        if self.operations.read().expect("operations lock").contains(labels) {
            return;
        }
        if !self.operations.write().expect("operations lock").insert(labels.clone()) {
            return;
        }
        self.duration.create(labels);
        // Streaming latency is generation's: an embeddings request has no first token.
        if labels.operation.is_generation() {
            for family in [&self.ttft, &self.answer_ttft, &self.tpot] {
                family.create(labels);
            }
            for family in [&self.inter_chunk, &self.tokens_per_chunk] {
                drop(family.get_or_create(labels));
            }
        }
        for tenant in &self.tenants {
            let counted = with_tenant(labels, tenant);
            for family in [&self.output_tokens, &self.input_tokens, &self.reasoning_tokens] {
                drop(family.get_or_create(&counted));
            }
            for outcome in Outcome::ALL.into_iter().filter(|o| o.is_created_at_zero()) {
                drop(self.requests.get_or_create(&TenantOutcomeLabels {
                    outcome: outcome_labels(labels, outcome),
                    tenant: tenant.clone(),
                }));
            }
        }
        for token_type in ["input", "output"] {
            drop(self.token_usage.get_or_create(&token_labels(labels, token_type)));
        }
    }
}

impl Reader for RequestFamilies {
    fn started(&self, request: &Started<'_>) -> Option<Arc<dyn Ongoing>> {
        let labels = self.request_labels(request.model, request.operation, request.provider);
        self.operation_seen(&labels);
        let gauge = self
            .in_flight
            .get_or_create(&InFlightLabels {
                model: request.model.clone(),
                operation: request.operation,
            })
            .clone();
        Some(Arc::new(InFlightRequest {
            inter_chunk: self.inter_chunk.get_or_create(&labels).clone(),
            _in_flight: GaugeGuard::new(gauge),
        }))
    }

    fn finished(&self, record: &RequestRecord) {
        if let Some(reason) = record.unmeasured {
            self.unmeasured.get_or_create(&UnmeasuredLabels { reason }).inc();
        }
        let labels = self.request_labels(&record.model, record.operation, record.provider);
        self.operation_seen(&labels);
        let tenant = TenantLabel(record.tenant.clone());
        let counted = with_tenant(&labels, &tenant);
        if tenant.0.is_some() {
            let source = record.tenant_source.map_or("none", TenantSource::as_str);
            self.tenant_sources.get_or_create(&TenantSourceLabels { source }).inc();
        }
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
            if timing.inconsistent > 0 {
                self.engine_fields_inconsistent.inc_by(u64::from(timing.inconsistent));
            }
        }
        if let Some(waiting) = record.engine_context.and_then(|c| c.waiting_at_arrival) {
            self.phases.observe_waiting(&labels, waiting);
        }
        if let Some(n) = record.reasoning_tokens {
            self.reasoning_tokens.get_or_create(&counted).inc_by(n);
        }
        for tpot in &record.tpot_per_choice {
            self.tpot.observe(&labels, tpot.as_secs_f64(), exemplar.clone());
        }
        if let Some(mean) = record.tokens_per_chunk() {
            self.tokens_per_chunk.get_or_create(&labels).observe(mean);
        }
        if let Some(n) = record.output_tokens {
            self.output_tokens.get_or_create(&counted).inc_by(n);
            self.token_usage
                .get_or_create(&token_labels(&labels, "output"))
                .observe(n as f64);
        }
        if let Some(n) = record.input_tokens {
            self.input_tokens.get_or_create(&counted).inc_by(n);
            self.token_usage
                .get_or_create(&token_labels(&labels, "input"))
                .observe(n as f64);
        }
        if let Some(source) = record.count_source {
            self.count_sources.get_or_create(&CountSourceLabels { source }).inc();
        }
        if let Some(basis) = record.tpot_basis {
            self.tpot_bases.get_or_create(&TpotBasisLabels { basis }).inc();
        }
        self.duration.observe(&labels, record.e2e.as_secs_f64(), exemplar);
        self.requests
            .get_or_create(&TenantOutcomeLabels {
                outcome: outcome_labels(&labels, record.outcome),
                tenant,
            })
            .inc();
    }

    fn tenant_forgotten(&self, tenant: &LabelText) {
        let tenant = TenantLabel(Some(tenant.clone()));
        for labels in self.operations.read().expect("operations lock").iter() {
            let counted = with_tenant(labels, &tenant);
            for family in [&self.output_tokens, &self.input_tokens, &self.reasoning_tokens] {
                family.remove(&counted);
            }
            for outcome in Outcome::ALL {
                self.requests.remove(&TenantOutcomeLabels {
                    outcome: outcome_labels(labels, outcome),
                    tenant: tenant.clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::metrics::Metrics;
    use crate::record::TraceRef;
    use std::time::Duration;

    /// The families alone in a registry, with `models` known on vLLM.
    fn metrics(models: &[&str]) -> (Arc<RequestFamilies>, Metrics) {
        let mut registry = Registry::default();
        let overrides = BucketOverrides::default();
        let families = Arc::new(RequestFamilies::new(
            &Edges::new(&overrides, &SloSet::default()),
            &overrides,
            None,
            &mut registry,
        ));
        for model in models {
            families.model_known(&LabelText::from(*model), Some(Engine::Vllm));
        }
        (families, registry.into_metrics(None))
    }

    fn record(model: &str, ms: u64, trace: Option<TraceRef>) -> RequestRecord {
        RequestRecord {
            ttft: Some(Duration::from_millis(5 * ms)),
            tpot_per_choice: vec![Duration::from_millis(ms)],
            output_tokens: Some(40),
            input_tokens: Some(7),
            token_events: 40,
            trace,
            provider: Some(Engine::Vllm),
            ..RequestRecord::new(model.into(), Operation::Chat, Duration::from_millis(40 * ms))
        }
    }

    #[test]
    fn an_apis_series_appear_at_zero_when_its_first_request_starts() {
        let (families, m) = metrics(&["llama"]);
        assert!(
            !m.encode().contains("operation="),
            "no API asked for yet: no series for one"
        );
        let running = families.started(&Started {
            model: &"llama".into(),
            operation: Operation::Chat,
            provider: Some(Engine::Vllm),
        });
        let text = m.encode();
        assert!(text.contains(
            "llmslo_requests_total{model=\"llama\",operation=\"chat\",provider=\"vllm\",outcome=\"upstream_error\"} 0"
        ));
        assert!(text.contains(
            "gen_ai_server_time_per_output_token_seconds_count{model=\"llama\",operation=\"chat\",provider=\"vllm\"} 0"
        ));
        assert!(!text.contains("text_completion"), "only the API asked for: {text}");
        assert!(text.contains("llmslo_build_info{version=\"0.1.0\"} 1"));
        assert!(text.ends_with("# EOF\n"));
        drop(running);
    }

    #[test]
    fn a_record_lands_in_every_family() {
        let (families, m) = metrics(&[]);
        let started = Started {
            model: &"llama".into(),
            operation: Operation::Chat,
            provider: Some(Engine::Vllm),
        };
        let ongoing = families.started(&started).expect("counted in flight");
        assert!(m
            .encode()
            .contains("llmslo_requests_in_flight{model=\"llama\",operation=\"chat\"} 1"));
        ongoing.gap(0.02);
        families.finished(&RequestRecord {
            ttft: Some(Duration::from_millis(120)),
            answer_ttft: Some(Duration::from_millis(120)),
            tpot_per_choice: vec![Duration::from_millis(20)],
            output_tokens: Some(21),
            input_tokens: Some(7),
            token_events: 7,
            provider: Some(Engine::Vllm),
            unmeasured: Some(UnmeasuredReason::DecodeError),
            ..RequestRecord::new("llama".into(), Operation::Chat, Duration::from_millis(500))
        });
        drop(ongoing);
        let text = m.encode();
        let l = "model=\"llama\",operation=\"chat\",provider=\"vllm\"";
        for line in [
            format!("gen_ai_server_time_to_first_token_seconds_sum{{{l}}} 0.12"),
            format!("gen_ai_server_time_to_first_token_seconds_bucket{{le=\"0.25\",{l}}} 1"),
            format!("gen_ai_server_time_to_first_token_seconds_bucket{{le=\"0.1\",{l}}} 0"),
            format!("gen_ai_server_time_per_output_token_seconds_sum{{{l}}} 0.02"),
            format!("llmslo_inter_chunk_latency_seconds_sum{{{l}}} 0.02"),
            format!("llmslo_tokens_per_chunk_sum{{{l}}} 3.0"),
            format!("llmslo_output_tokens_total{{{l}}} 21"),
            format!("llmslo_input_tokens_total{{{l}}} 7"),
            format!("gen_ai_client_token_usage_sum{{{l},token_type=\"output\"}} 21.0"),
            format!("llmslo_requests_total{{{l},outcome=\"success\"}} 1"),
            format!("gen_ai_server_request_duration_seconds_count{{{l}}} 1"),
            "llmslo_requests_in_flight{model=\"llama\",operation=\"chat\"} 0".to_string(),
            "llmslo_unmeasured_responses_total{reason=\"decode_error\"} 1".to_string(),
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
        let (families, m) = metrics(&["llama"]);
        let trace = TraceRef {
            trace_id: opentelemetry::trace::TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
            span_id: opentelemetry::trace::SpanId::from_hex("b7ad6b7169203331").unwrap(),
        };
        for ms in [20, 30, 30, 45] {
            families.finished(&record("llama", ms, Some(trace)));
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
                assert_eq!(h.schema, i32::from(crate::metrics::native::SCHEMA), "{}", family.name);
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
