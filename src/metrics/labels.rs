//! Label sets and the bounded model-name normaliser.

use crate::record::CountSource;
use crate::record::Operation;
use crate::record::Outcome;
use crate::record::{TraceRef, UnmeasuredReason};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use std::collections::HashSet;
use std::fmt::Write;
use std::sync::RwLock;

/// Label value for requests whose body named no model (or could not be read).
pub const UNKNOWN_MODEL: &str = "unknown";
/// Label value for models outside the allow-list or past `max_models`.
pub const OTHER_MODEL: &str = "other";
/// Longest model name kept as a label value.
const MAX_MODEL_NAME_LEN: usize = 128;

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
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    /// Normalised model.
    pub model: String,
    /// Route-derived operation.
    pub operation: Operation,
    /// Engine kind.
    pub provider: String,
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Normalised model.
    pub model: String,
    /// Route-derived operation.
    pub operation: Operation,
    /// Engine kind.
    pub provider: String,
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
}

impl RefusalReason {
    /// Every reason, in label order.
    pub const ALL: [RefusalReason; 4] = [
        RefusalReason::RequestBufferFull,
        RefusalReason::ConnectionLimit,
        RefusalReason::InFlightLimit,
        RefusalReason::FileDescriptors,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::RequestBufferFull => "request_buffer_full",
            RefusalReason::ConnectionLimit => "connection_limit",
            RefusalReason::InFlightLimit => "in_flight_limit",
            RefusalReason::FileDescriptors => "file_descriptors",
        }
    }

    /// The limit that was reached, as the client is told it (a config key where there is one).
    pub fn limit(self) -> &'static str {
        match self {
            RefusalReason::RequestBufferFull => "max_buffered_request_bytes",
            RefusalReason::ConnectionLimit => "max_connections",
            RefusalReason::InFlightLimit => "max_in_flight_requests",
            RefusalReason::FileDescriptors => "open-file",
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

/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Why the work was refused.
    pub reason: RefusalReason,
}

/// `model`, `operation`, `provider`, `token_type`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct TokenLabels {
    /// Normalised model.
    pub model: String,
    /// Route-derived operation.
    pub operation: Operation,
    /// Engine kind.
    pub provider: String,
    /// `input` or `output`.
    pub token_type: &'static str,
}

/// `model`, `operation`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct InFlightLabels {
    /// Normalised model.
    pub model: String,
    /// Route-derived operation.
    pub operation: Operation,
}

/// `version`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version.
    pub version: &'static str,
}

/// Maps request-supplied model names onto a bounded set of label values.
#[derive(Debug)]
pub struct ModelNames {
    allow_list: Option<HashSet<String>>,
    learned: RwLock<HashSet<String>>,
    max_models: usize,
    /// The engine's only model, for requests that name none (TGI's native API).
    only_served: RwLock<Option<String>>,
}

impl ModelNames {
    /// An allow-list when `models` is non-empty, else learning up to `max_models` names.
    pub fn new(models: &[String], max_models: usize) -> Self {
        Self {
            allow_list: (!models.is_empty()).then(|| models.iter().cloned().collect()),
            learned: RwLock::new(HashSet::new()),
            max_models,
            only_served: RwLock::new(None),
        }
    }

    /// Notes the models the engine serves; when it serves exactly one, requests that name
    /// no model are labelled with it.
    pub fn set_served(&self, served: &[String]) {
        let only = match served {
            [only] => Some(only.clone()),
            _ => None,
        };
        *self.only_served.write().expect("model set lock") = only;
    }

    /// The models known so far: the allow-list, or those learned.
    pub fn known(&self) -> Vec<String> {
        let mut models: Vec<String> = match &self.allow_list {
            Some(allowed) => allowed.iter().cloned().collect(),
            None => self.learned.read().expect("model set lock").iter().cloned().collect(),
        };
        models.sort();
        models
    }

    /// The label value for a request that named `raw` (or nothing), without learning: a name
    /// not known yet is labelled `other`, and comes back as the candidate to learn once the
    /// engine has answered it successfully.
    pub fn label(&self, raw: Option<&str>) -> (String, Option<String>) {
        let only_served;
        let name = match raw {
            Some(name) => name,
            None => {
                // Only requests that name no model need the engine's only model.
                only_served = self.only_served.read().expect("model set lock").clone();
                match only_served.as_deref() {
                    Some(name) => name,
                    None => return (UNKNOWN_MODEL.to_string(), None),
                }
            }
        };
        if let Some(allowed) = &self.allow_list {
            let label = if allowed.contains(name) { name } else { OTHER_MODEL };
            return (label.to_string(), None);
        }
        if !is_plausible_model_name(name) {
            return (OTHER_MODEL.to_string(), None);
        }
        if raw.is_none() {
            return (name.to_string(), None); // the engine's own (only) model
        }
        if self.learned.read().expect("model set lock").contains(name) {
            return (name.to_string(), None);
        }
        (OTHER_MODEL.to_string(), Some(name.to_string()))
    }

    /// Learns `name` (the engine lists it, or answered it successfully) while fewer than
    /// `max_models` are known: its label, and whether it was just learned.
    pub fn learn(&self, name: &str) -> (String, bool) {
        if self.allow_list.is_some() || !is_plausible_model_name(name) {
            return (self.label(Some(name)).0, false);
        }
        let mut learned = self.learned.write().expect("model set lock");
        if learned.contains(name) {
            (name.to_string(), false)
        } else if learned.len() < self.max_models {
            learned.insert(name.to_string());
            (name.to_string(), true)
        } else {
            (OTHER_MODEL.to_string(), false)
        }
    }
}

/// Whether a client's model name may become a label: a model id's length and characters
/// (letters, digits and `-._/:@+`, as in `meta-llama/Llama-3.1-8B-Instruct` or `llama3:8b`).
fn is_plausible_model_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_MODEL_NAME_LEN
        && name != UNKNOWN_MODEL
        && name != OTHER_MODEL
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._/:@+".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_maps_everything_else_to_other() {
        let names = ModelNames::new(&["llama".into()], 16);
        assert_eq!(names.label(Some("llama")).0, "llama");
        assert_eq!(names.label(Some("gpt-x")), (OTHER_MODEL.to_string(), None));
        assert_eq!(names.learn("gpt-x").0, OTHER_MODEL, "the allow-list is never extended");
        assert_eq!(names.label(None).0, UNKNOWN_MODEL);
        assert_eq!(names.known(), ["llama"]);
    }

    #[test]
    fn requests_without_a_model_get_the_only_served_one() {
        let names = ModelNames::new(&[], 4);
        assert_eq!(names.label(None).0, UNKNOWN_MODEL);
        names.set_served(&["tgi-model".into()]);
        assert_eq!(names.label(None).0, "tgi-model");
        names.set_served(&["a".into(), "b".into()]);
        assert_eq!(names.label(None).0, UNKNOWN_MODEL, "ambiguous with two");
    }

    #[test]
    fn learning_stops_at_max_models() {
        let names = ModelNames::new(&[], 2);
        assert_eq!(
            names.label(Some("a")),
            (OTHER_MODEL.to_string(), Some("a".to_string())),
            "not learned by asking"
        );
        assert_eq!(names.learn("a"), ("a".to_string(), true));
        assert_eq!(names.learn("b"), ("b".to_string(), true));
        assert_eq!(names.learn("c"), (OTHER_MODEL.to_string(), false));
        assert_eq!(names.learn("a"), ("a".to_string(), false));
        assert_eq!(names.label(Some("a")), ("a".to_string(), None));
    }

    #[test]
    fn implausible_names_are_other_and_not_learned() {
        let names = ModelNames::new(&[], 1);
        for bad in [
            "",
            "has space",
            &"x".repeat(200),
            "unknown",
            "quote\"d",
            "back\\slash",
            "new\nline",
            "brace}",
            "x\u{e9}",
        ] {
            assert_eq!(names.label(Some(bad)), (OTHER_MODEL.to_string(), None), "{bad}");
        }
        assert_eq!(names.label(Some("ok")).1.as_deref(), Some("ok"));
        for good in [
            "meta-llama/Llama-3.1-8B-Instruct",
            "llama3:8b",
            "org/model@rev",
            "a+b_c.d",
        ] {
            assert_eq!(names.label(Some(good)).1.as_deref(), Some(good), "{good}");
        }
    }

    #[test]
    fn configured_names_stay_raw_for_the_encoders_to_escape() {
        let names = ModelNames::new(&["we\"ird\\".into()], 4);
        assert_eq!(names.label(Some("we\"ird\\")).0, "we\"ird\\");
        assert_eq!(names.known(), ["we\"ird\\"]);
    }
}
