//! The label sets of the Prometheus families.

use crate::fingerprint::hash_as_fingerprint;
use crate::record::Operation;
use crate::record::Outcome;
use crate::record::{CountSource, TpotBasis};
use crate::record::{LabelText, TraceRef, UnmeasuredReason};
use crate::tenant::TenantLabel;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use std::fmt::Write;

// The label sets a request's record is counted under hash as their fingerprint: one word.
hash_as_fingerprint!(RequestLabels: model, operation, provider);
hash_as_fingerprint!(TenantRequestLabels: request, tenant);
hash_as_fingerprint!(TenantOutcomeLabels: outcome, tenant);
hash_as_fingerprint!(OutcomeLabels: model, operation, provider, outcome);
hash_as_fingerprint!(TokenLabels: model, operation, provider, token_type);
hash_as_fingerprint!(InFlightLabels: model, operation);

impl EncodeLabelValue for Operation {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// `model`, `operation`, `provider`.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Normalised model.
    pub model: LabelText,
    /// Route-derived operation.
    pub operation: Operation,
    /// Engine kind.
    pub provider: &'static str,
}

/// `model`, `operation`, `provider` and, with tenants, `tenant`: the token counters.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantRequestLabels {
    /// The request's labels.
    #[prometheus(flatten)]
    pub request: RequestLabels,
    /// Its tenant.
    #[prometheus(flatten)]
    pub tenant: TenantLabel,
}

/// `model`, `operation`, `provider`, `outcome` and, with tenants, `tenant`: the request
/// counter.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantOutcomeLabels {
    /// The request's labels and outcome.
    #[prometheus(flatten)]
    pub outcome: OutcomeLabels,
    /// Its tenant.
    #[prometheus(flatten)]
    pub tenant: TenantLabel,
}

/// `source` of a request's tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TenantSourceLabels {
    /// Where the tenant was read from, or `none`.
    pub source: &'static str,
}

/// An exemplar's labels: the trace and span of the observation (Grafana links `trace_id`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ExemplarLabels {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
}

impl From<TraceRef> for ExemplarLabels {
    fn from(trace: TraceRef) -> Self {
        Self {
            trace_id: trace.trace_id.to_string(),
            span_id: trace.span_id.to_string(),
        }
    }
}

/// `model`, `operation`, `provider`, `outcome`.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Normalised model.
    pub model: LabelText,
    /// Route-derived operation.
    pub operation: Operation,
    /// Engine kind.
    pub provider: &'static str,
    /// How the request ended.
    pub outcome: Outcome,
}

/// Why the sidecar refused work to protect itself (`llmslo_requests_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusalReason {
    /// `max_buffered_request_bytes` was reached: 503 with Retry-After.
    RequestBufferFull,
    /// `max_connections` was reached: the new connection got a 503 and was closed.
    ConnectionLimit,
    /// `max_in_flight_requests` was reached: 503 with Retry-After.
    InFlightLimit,
    /// The sidecar's own open-file limit stopped a connection to the engine: 503 with
    /// Retry-After, never counted as the engine's fault.
    FileDescriptors,
    /// One client address held its share of the in-flight slots (`max_in_flight_per_client`):
    /// 429 with Retry-After, so that no one client (holding streams it does not read, say)
    /// keeps the others out.
    ClientInFlightLimit,
}

impl RefusalReason {
    /// Every reason, in label order.
    pub const ALL: [RefusalReason; 5] = [
        RefusalReason::RequestBufferFull,
        RefusalReason::ConnectionLimit,
        RefusalReason::InFlightLimit,
        RefusalReason::FileDescriptors,
        RefusalReason::ClientInFlightLimit,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::RequestBufferFull => "request_buffer_full",
            RefusalReason::ConnectionLimit => "connection_limit",
            RefusalReason::InFlightLimit => "in_flight_limit",
            RefusalReason::FileDescriptors => "file_descriptors",
            RefusalReason::ClientInFlightLimit => "client_in_flight_limit",
        }
    }

    /// The limit that was reached, as the client is told it (a config key where there is one).
    pub fn limit(self) -> &'static str {
        match self {
            RefusalReason::RequestBufferFull => "max_buffered_request_bytes",
            RefusalReason::ConnectionLimit => "max_connections",
            RefusalReason::InFlightLimit => "max_in_flight_requests",
            RefusalReason::FileDescriptors => "open-file",
            RefusalReason::ClientInFlightLimit => "max_in_flight_per_client",
        }
    }
}

impl EncodeLabelValue for RefusalReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// Which deadline cut a client off (`llmslo_client_timeouts_total`): each frees what the
/// client held without making progress, and is named by the config key that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientTimeout {
    /// A response frame the client did not take for `send_timeout` (a full socket, or an
    /// HTTP/2 window kept shut): the response was dropped and its stream reset.
    Send,
    /// A connection with no request open for `connection_idle_timeout` was closed.
    ConnectionIdle,
    /// A request body that fell below `request_body_min_rate` (or past its read timeouts).
    RequestBody,
}

impl ClientTimeout {
    /// Every deadline, in label order.
    pub const ALL: [ClientTimeout; 3] = [
        ClientTimeout::ConnectionIdle,
        ClientTimeout::RequestBody,
        ClientTimeout::Send,
    ];

    /// The `timeout` label value: the config key that sets the deadline.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientTimeout::Send => "send_timeout",
            ClientTimeout::ConnectionIdle => "connection_idle_timeout",
            ClientTimeout::RequestBody => "request_body_min_rate",
        }
    }
}

impl EncodeLabelValue for ClientTimeout {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// `timeout`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ClientTimeoutLabels {
    /// The deadline that passed.
    pub timeout: ClientTimeout,
}

impl EncodeLabelValue for UnmeasuredReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// `reason` of an unmeasured response.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct UnmeasuredLabels {
    /// Why it could not be measured.
    pub reason: UnmeasuredReason,
}

impl EncodeLabelValue for CountSource {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// `source` of a token count.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CountSourceLabels {
    /// Where the count came from.
    pub source: CountSource,
}

impl EncodeLabelValue for TpotBasis {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// `basis` of a TPOT.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TpotBasisLabels {
    /// How the TPOT was known.
    pub basis: TpotBasis,
}

/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Why the work was refused.
    pub reason: RefusalReason,
}

/// `model`, `operation`, `provider`, `token_type`.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// Normalised model.
    pub model: LabelText,
    /// Route-derived operation.
    pub operation: Operation,
    /// Engine kind.
    pub provider: &'static str,
    /// `input` or `output`.
    pub token_type: &'static str,
}

/// `model`, `operation`.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct InFlightLabels {
    /// Normalised model.
    pub model: LabelText,
    /// Route-derived operation.
    pub operation: Operation,
}

/// `version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash, Hasher, RandomState};

    /// Counts the words and byte runs it is fed.
    #[derive(Default)]
    struct Writes(usize);

    impl Hasher for Writes {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, _: &[u8]) {
            self.0 += 1;
        }
    }

    fn labels(model: &str, operation: Operation, provider: &'static str) -> RequestLabels {
        RequestLabels {
            model: model.into(),
            operation,
            provider,
        }
    }

    #[test]
    fn a_label_set_hands_its_family_one_word() {
        let mut writes = Writes::default();
        labels("llama", Operation::Chat, "vllm").hash(&mut writes);
        assert_eq!(writes.0, 1);
        let mut writes = Writes::default();
        let outcome = OutcomeLabels {
            model: "llama".into(),
            operation: Operation::Chat,
            provider: "vllm",
            outcome: Outcome::Success,
        };
        TenantOutcomeLabels {
            outcome,
            tenant: TenantLabel(Some("team-a".into())),
        }
        .hash(&mut writes);
        assert_eq!(writes.0, 1);
    }

    #[test]
    fn equal_label_sets_hash_alike_and_any_field_tells_them_apart() {
        let sip = RandomState::new();
        let base = labels("llama", Operation::Chat, "vllm");
        assert_eq!(sip.hash_one(&base), sip.hash_one(base.clone()));
        for other in [
            labels("llama2", Operation::Chat, "vllm"),
            labels("llama", Operation::TextCompletion, "vllm"),
            labels("llama", Operation::Chat, "sglang"),
            // The values' boundaries count: not one string run together.
            labels("llamav", Operation::Chat, "llm"),
        ] {
            assert_ne!(sip.hash_one(&base), sip.hash_one(&other), "{other:?}");
        }
    }
}
