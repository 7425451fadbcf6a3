//! The request record: what one finished request measured, and the words every reader of it
//! shares (its model's and tenant's label values, its operation, outcome, engine, token count
//! source, the engine's own timing, the load it ran under, its trace). The observer produces records; the Prometheus families, the
//! SLOs, the capacity model, the OTLP exporter and any other [`Reader`] read them.
//!
//! This module is the ground floor: it imports nothing else of the crate.

mod disagg;
mod engine;
mod label_text;
mod load;
mod operation;
mod reader;
mod trace;

pub use disagg::{
    names_prefill_pod, LegPhase, PrefillDiverter, PrefillTimer, RelaySkip, Role, Served, TtftPart, TtftParts,
    PREFILLER_HEADERS,
};
pub use engine::{Engine, EngineContext, EngineMoment, EngineTiming, Fault};
pub use label_text::LabelText;
pub use load::RequestLoad;
pub use operation::{Operation, Protocol};
pub use reader::{Ongoing, Reader, Readers, Started};
use std::time::Duration;
pub use trace::TraceRef;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Completed normally.
    Success,
    /// Status ≥ 500, an engine error reported after 200, or a stream cut short.
    UpstreamError,
    /// The engine answered 4xx, or reported after 200 that the request was invalid.
    ClientError,
    /// The client went away before the response ended.
    ClientCancelled,
    /// The engine did not send a response head in time (the sidecar answered 504).
    Timeout,
    /// The engine could not be reached (the sidecar answered 502).
    ConnectError,
    /// The sidecar was stopping and its drain deadline passed before the response ended: cut
    /// by the sidecar, neither the client's doing nor the engine's.
    Shutdown,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Success,
        Outcome::UpstreamError,
        Outcome::ClientError,
        Outcome::ClientCancelled,
        Outcome::Timeout,
        Outcome::ConnectError,
        Outcome::Shutdown,
    ];

    /// Whether its series exist from the start: all but `shutdown`'s, which a sidecar sees
    /// only as it stops.
    pub fn is_created_at_zero(self) -> bool {
        self != Outcome::Shutdown
    }

    /// Whether a request that ended so says nothing of the service: the client's doing, or
    /// the sidecar's own stop. It is no event of any SLO.
    pub fn is_not_the_services(self) -> bool {
        matches!(
            self,
            Outcome::ClientError | Outcome::ClientCancelled | Outcome::Shutdown
        )
    }

    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::UpstreamError => "upstream_error",
            Outcome::ClientError => "client_error",
            Outcome::ClientCancelled => "client_cancelled",
            Outcome::Timeout => "timeout",
            Outcome::ConnectError => "connect_error",
            Outcome::Shutdown => "shutdown",
        }
    }

    /// The outcome of an error reported inside a successful answer.
    pub fn of_fault(fault: Fault) -> Self {
        match fault {
            Fault::Client => Outcome::ClientError,
            Fault::Engine => Outcome::UpstreamError,
        }
    }

    /// The outcome an HTTP status implies before the body is seen, if it decides one.
    pub fn from_status(status: u16) -> Option<Self> {
        match status {
            500.. => Some(Outcome::UpstreamError),
            400..=499 => Some(Outcome::ClientError),
            _ => None,
        }
    }
}

/// Everything measured about one finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    /// Normalised model label.
    pub model: LabelText,
    /// Route-derived operation.
    pub operation: Operation,
    /// How it ended.
    pub outcome: Outcome,
    /// Time to first token, when a first token was seen.
    pub ttft: Option<Duration>,
    /// Time to the first token of the answer itself (after any reasoning), when one was seen.
    pub answer_ttft: Option<Duration>,
    /// Time per output token of each choice that had at least two token events
    /// (one entry for ordinary requests, one per choice for `n > 1`).
    pub tpot_per_choice: Vec<Duration>,
    /// How its TPOT was known, when it had one.
    pub tpot_basis: Option<TpotBasis>,
    /// Request head to end of response (or abort).
    pub e2e: Duration,
    /// Output tokens: from usage when reported, else counted from events.
    pub output_tokens: Option<u64>,
    /// Input tokens from usage, when reported.
    pub input_tokens: Option<u64>,
    /// Output tokens spent on reasoning, when the usage reports them.
    pub reasoning_tokens: Option<u64>,
    /// Stream events that carried tokens.
    pub token_events: u64,
    /// Where a stream's output token count came from; `None` for other responses.
    pub count_source: Option<CountSource>,
    /// The load it ran under, when the sidecar metered it.
    pub load: Option<RequestLoad>,
    /// The engine's own timing of it, where the answer stated one.
    pub engine: Option<EngineTiming>,
    /// What the engine's `/metrics` showed around it, when llmslo reads them.
    pub engine_context: Option<EngineContext>,
    /// The sampled trace it belongs to (llmslo's span, or the client's): its exemplar.
    pub trace: Option<TraceRef>,
    /// The engine behind the sidecar as it ended, when configured or learned by then.
    pub provider: Option<Engine>,
    /// Why its successful response could not be read, when it could not.
    pub unmeasured: Option<UnmeasuredReason>,
    /// Its tenant's label, when tenants are configured (`unknown` when no source named one).
    pub tenant: Option<LabelText>,
    /// Where its tenant was read from, when a source named one.
    pub tenant_source: Option<TenantSource>,
    /// The latency targets the request carried itself (`x-llm-d-slo-ttft-ms` and the like),
    /// when per-request SLOs are on.
    pub targets: RequestTargets,
    /// How it was served, when the pod is in disaggregated serving or the router said.
    pub served: Option<Served>,
    /// The parts of its TTFT, for a disaggregated request that reached its first token.
    pub ttft_parts: Option<TtftParts>,
    /// Why the relay did not time its prefill leg, when the relay is on and the router named
    /// a prefill pod it would not send the leg to.
    pub relay_skipped: Option<RelaySkip>,
    /// The leg its fields claimed, when it carried a leg's fields where no such leg is
    /// expected, and so was measured in full as the user request it is.
    pub leg_fields_ignored: Option<LegPhase>,
}

impl RequestRecord {
    /// A record of `operation` on `model` that took `e2e`, before anything else is known.
    pub fn new(model: LabelText, operation: Operation, e2e: Duration) -> Self {
        Self {
            model,
            operation,
            outcome: Outcome::Success,
            ttft: None,
            answer_ttft: None,
            tpot_per_choice: Vec::new(),
            tpot_basis: None,
            e2e,
            output_tokens: None,
            input_tokens: None,
            reasoning_tokens: None,
            token_events: 0,
            count_source: None,
            load: None,
            engine: None,
            engine_context: None,
            trace: None,
            provider: None,
            unmeasured: None,
            tenant: None,
            tenant_source: None,
            targets: RequestTargets::default(),
            served: None,
            ttft_parts: None,
            relay_skipped: None,
            leg_fields_ignored: None,
        }
    }

    /// The request's TPOT: its slowest choice's (for `n = 1`, simply its TPOT).
    pub fn tpot(&self) -> Option<Duration> {
        self.tpot_per_choice.iter().max().copied()
    }

    /// Mean output tokens per token-carrying stream event, when both are known.
    pub fn tokens_per_chunk(&self) -> Option<f64> {
        match (self.output_tokens, self.token_events) {
            (Some(n), events) if events > 0 => Some(n as f64 / events as f64),
            _ => None,
        }
    }
}

/// Where a response's output token count came from (`llmslo_token_count_source_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CountSource {
    /// The engine's `usage.completion_tokens` (or TGI's `details.generated_tokens`).
    Usage,
    /// Counts every event stated: `token_ids` or `logprobs.content` lengths, or TGI's
    /// one-token events.
    TokenIds,
    /// The configured tokenizer, over the generated text.
    Tokenizer,
    /// Only the events could be counted, and an event may hold several tokens: the token
    /// count and TPOT are unknown.
    Events,
}

impl CountSource {
    /// Every source, in label order.
    pub const ALL: [CountSource; 4] = [
        CountSource::Usage,
        CountSource::TokenIds,
        CountSource::Tokenizer,
        CountSource::Events,
    ];

    /// The `source` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CountSource::Usage => "usage",
            CountSource::TokenIds => "token_ids",
            CountSource::Tokenizer => "tokenizer",
            CountSource::Events => "events",
        }
    }
}

/// How a request's TPOT was known (`llmslo_tpot_basis_total`), from the surest to the least
/// sure, so that the largest of several choices' is the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TpotBasis {
    /// The stream's own times: every token's event, or the first token's and the last's with
    /// the count of tokens between them.
    Stream,
    /// The engine's own figure for the request (vLLM's per-request `mean_itl_ms`), where
    /// tokens the stream held back left its figure an estimate.
    Engine,
    /// An estimate: tokens were held back without an event of their own, and nothing in the
    /// answer says when they were made (the gaps between the later events are read as steps).
    Estimated,
}

impl TpotBasis {
    /// Every basis, in label order.
    pub const ALL: [TpotBasis; 3] = [TpotBasis::Engine, TpotBasis::Estimated, TpotBasis::Stream];

    /// The `basis` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TpotBasis::Stream => "stream",
            TpotBasis::Engine => "engine",
            TpotBasis::Estimated => "estimated",
        }
    }
}

/// Why a successful response could not be measured (`llmslo_unmeasured_responses_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnmeasuredReason {
    /// A `Content-Encoding` llmslo cannot decode.
    ContentEncoding,
    /// A compressed body that failed to decode part-way.
    DecodeError,
    /// A stream event over `max_event_bytes` stopped interpretation.
    OversizedEvent,
}

impl UnmeasuredReason {
    /// Every reason, in label order.
    pub const ALL: [UnmeasuredReason; 3] = [
        UnmeasuredReason::ContentEncoding,
        UnmeasuredReason::DecodeError,
        UnmeasuredReason::OversizedEvent,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            UnmeasuredReason::ContentEncoding => "content_encoding",
            UnmeasuredReason::DecodeError => "decode_error",
            UnmeasuredReason::OversizedEvent => "oversized_event",
        }
    }
}

/// Where a request's tenant was read from (`llmslo_tenant_sources_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TenantSource {
    /// A configured request header.
    Header,
    /// The API key, through the configured table.
    ApiKey,
    /// A body field (`safety_identifier`, `user`, `metadata.user_id`).
    Body,
}

impl TenantSource {
    /// Every source, in label order.
    pub const ALL: [TenantSource; 3] = [TenantSource::Header, TenantSource::ApiKey, TenantSource::Body];

    /// The `source` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TenantSource::Header => "header",
            TenantSource::ApiKey => "api_key",
            TenantSource::Body => "body",
        }
    }
}

/// How the latency targets a request states for itself (`x-llm-d-slo-ttft-ms`, …) are taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PerRequestSlos {
    /// Ignored.
    Off,
    /// They are judged apart from the pod's goodput (which the SLO file alone decides) and
    /// counted on their own, so no client can grade itself, nor move anyone's figures.
    #[default]
    Separate,
    /// They replace the file's goodput SLOs for that request: for headers a trusted component
    /// (a gateway that sets them and drops the client's own) writes.
    Trusted,
}

/// Latency targets a request states for itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTargets {
    /// Its own TTFT target.
    pub ttft: Option<Duration>,
    /// Its own TPOT target.
    pub tpot: Option<Duration>,
    /// They replace the file's goodput SLOs (`per_request_slos: trusted`), rather than being
    /// judged apart.
    pub trusted: bool,
}

impl RequestTargets {
    /// Whether it states any target.
    pub fn any(&self) -> bool {
        self.ttft.is_some() || self.tpot.is_some()
    }

    /// Whether `record` met every target it states (a record without a TTFT or TPOT misses
    /// a target on it).
    pub fn met_by(&self, record: &RequestRecord) -> bool {
        let within = |value: Option<Duration>, target: Option<Duration>| match target {
            None => true,
            Some(target) => value.is_some_and(|v| v <= target),
        };
        within(record.ttft, self.ttft) && within(record.tpot(), self.tpot)
    }
}
