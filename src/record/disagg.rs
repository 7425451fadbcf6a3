//! Disaggregated serving as the record sees it: a pod's role, the legs one user request is
//! split into across pods, how a user request was served, and the parts its first token was
//! made of.

use super::EngineTiming;
use std::time::Duration;

/// What a pod does in disaggregated serving (`role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill and decode in one engine: every request is a user request.
    #[default]
    Aggregated,
    /// A prefill pool's pod: it should see only prefill legs.
    Prefill,
    /// A decode pool's pod: it takes the client's stream (in front of the routing sidecar).
    Decode,
    /// In front of a router that serves every request disaggregated (vLLM's `vllm-router`,
    /// SGLang's router, in P/D mode): every request is a user request served so, its legs
    /// out of sight.
    Router,
}

impl Role {
    /// The `role` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Router => "router",
        }
    }

    /// The role a `role` value names (`aggregated`, `prefill`, `decode`), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [Role::Aggregated, Role::Prefill, Role::Decode, Role::Router]
            .into_iter()
            .find(|role| role.as_str() == name)
    }

    /// The role a Kubernetes pod label value names (llm-d's `llm-d.ai/role`, where `both` is
    /// an aggregated pod), if any.
    pub fn from_label(value: &str) -> Option<Self> {
        match value {
            "both" => Some(Role::Aggregated),
            name => Self::from_name(name),
        }
    }
}

/// Which leg of a disaggregated request a request is, read from its `kv_transfer_params`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LegPhase {
    /// `do_remote_decode: true`: the prompt's prefill, its KV cache kept for a decode pod.
    Prefill,
    /// `do_remote_prefill: true`: the decode, pulling the KV cache a prefill pod made.
    Decode,
}

impl LegPhase {
    /// The `phase` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LegPhase::Prefill => "prefill",
            LegPhase::Decode => "decode",
        }
    }
}

/// How a user request was served (`served`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Served {
    /// One engine did both phases.
    Aggregated,
    /// The router named a prefill pod (`x-prefiller-host-port`): prefill there, decode here;
    /// or a P/D router behind llmslo (`role: router`) served it on two pools.
    Disaggregated,
    /// A decode pod did both phases itself: the router named no prefill pod.
    DecodeOnly,
}

impl Served {
    /// The `served` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Served::Aggregated => "aggregated",
            Served::Disaggregated => "disaggregated",
            Served::DecodeOnly => "decode_only",
        }
    }
}

/// Why the relay left a request's prefill leg to the routing sidecar (untimed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelaySkip {
    /// The router named several pods (the routing sidecar picks one), or something that is
    /// not one `address:port`.
    NotOneAddress,
    /// The named address is not a pod of the prefill pool: only the request named it.
    OutsidePool,
}

impl RelaySkip {
    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RelaySkip::NotOneAddress => "not_one_address",
            RelaySkip::OutsidePool => "outside_pool",
        }
    }
}

/// What timed a request's prefill leg (the decode pod's relay): held while the request runs.
pub trait PrefillTimer: Send + Sync + std::fmt::Debug {
    /// The prefill leg's time, once it was timed and answered successfully.
    fn prefill(&self) -> Option<Duration>;
}

/// The headers llm-d's router names a request's prefill pod in: `x-prefiller-host-port`, and
/// the older `x-prefiller-url`.
pub static PREFILLER_HEADERS: [http::HeaderName; 2] = [
    http::HeaderName::from_static("x-prefiller-host-port"),
    http::HeaderName::from_static("x-prefiller-url"),
];

/// Whether the router named a prefill pod for this request.
pub fn names_prefill_pod(headers: &http::HeaderMap) -> bool {
    PREFILLER_HEADERS.iter().any(|name| {
        headers
            .get_all(name)
            .iter()
            .any(|v| !v.as_bytes().trim_ascii().is_empty())
    })
}

/// Where a decode pod's prefill legs go to be timed (the sidecar's relay), as the observer
/// that diverts them sees it.
pub trait PrefillDiverter: Send + Sync + std::fmt::Debug {
    /// Drops from a request what only the diverter writes (a client's forged tag).
    fn untag(&self, headers: &mut http::HeaderMap);
    /// Has the prefill leg of a request that names a prefill pod come through the diverter:
    /// what times it, or why it goes on untouched.
    fn divert_prefill(
        self: std::sync::Arc<Self>,
        headers: &mut http::HeaderMap,
    ) -> Result<Box<dyn PrefillTimer>, RelaySkip>;
}

/// How far the measured parts may add up past the TTFT (the engine rounds to milliseconds).
const PARTS_SLACK_SECONDS: f64 = 0.001;

/// One part of a disaggregated request's time to first token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TtftPart {
    /// The prefill leg, from the routing sidecar sending it to its answer: the prefill pod's
    /// queue and prefill, and the network between.
    Prefill,
    /// The decode engine's queue (its own `queue_time_ms`).
    DecodeQueue,
    /// The decode engine from scheduling to the first token: pulling the KV blocks and the
    /// first step (its own `time_to_first_token_ms`).
    KvTransfer,
    /// The rest: the routing sidecar, the network, HTTP.
    Coordination,
}

impl TtftPart {
    /// The `part` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            TtftPart::Prefill => "prefill",
            TtftPart::DecodeQueue => "decode_queue",
            TtftPart::KvTransfer => "kv_transfer",
            TtftPart::Coordination => "coordination",
        }
    }
}

/// The parts of a disaggregated request's TTFT, in seconds; `None` is a part not measured.
/// The coordination part is what is left once every other part is known, so when all four are
/// known they add up to the TTFT.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TtftParts {
    /// The prefill leg, when llmslo relayed it.
    pub prefill: Option<f64>,
    /// The decode engine's queue, when its answer states it.
    pub decode_queue: Option<f64>,
    /// The decode engine's scheduling to first token, when its answer states it.
    pub kv_transfer: Option<f64>,
    /// The rest, when every other part is known.
    pub coordination: Option<f64>,
}

impl TtftParts {
    /// Splits `ttft` with the prefill leg llmslo timed and the decode engine's own account.
    pub fn split(ttft: Duration, prefill: Option<Duration>, engine: Option<EngineTiming>) -> Self {
        let ttft = ttft.as_secs_f64();
        // Each part lies within the TTFT, and the measured ones add up to no more than it:
        // engine figures that do not fit are left unmeasured (the relay's is llmslo's own clock).
        let within = |v: Option<f64>| v.filter(|v| v.is_finite() && (0.0..=ttft).contains(v));
        let prefill = within(prefill.map(|d| d.as_secs_f64()));
        let (mut decode_queue, mut kv_transfer) = (
            within(engine.and_then(|e| e.queue)),
            within(engine.and_then(|e| e.prefill)),
        );
        let measured = prefill.unwrap_or(0.0) + decode_queue.unwrap_or(0.0) + kv_transfer.unwrap_or(0.0);
        if measured > ttft + PARTS_SLACK_SECONDS {
            (decode_queue, kv_transfer) = (None, None);
        }
        let coordination = match (prefill, decode_queue, kv_transfer) {
            (Some(p), Some(q), Some(k)) => Some((ttft - p - q - k).max(0.0)),
            _ => None,
        };
        Self {
            prefill,
            decode_queue,
            kv_transfer,
            coordination,
        }
    }

    /// Each part with its value (`None`: not measured).
    pub fn each(&self) -> [(TtftPart, Option<f64>); 4] {
        [
            (TtftPart::Prefill, self.prefill),
            (TtftPart::DecodeQueue, self.decode_queue),
            (TtftPart::KvTransfer, self.kv_transfer),
            (TtftPart::Coordination, self.coordination),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_a_prefill_pod_with_a_non_blank_header() {
        let named = |values: &[&str]| {
            let mut headers = http::HeaderMap::new();
            for v in values {
                headers.append(&PREFILLER_HEADERS[0], http::HeaderValue::from_str(v).unwrap());
            }
            names_prefill_pod(&headers)
        };
        assert!(named(&["10.0.0.5:8000"]));
        assert!(!named(&[" "]));
        assert!(!named(&[]));
    }

    #[test]
    fn the_parts_add_up_to_the_ttft_only_when_each_is_known() {
        let engine = EngineTiming {
            queue: Some(0.05),
            prefill: Some(0.08),
            ..EngineTiming::default()
        };
        let ttft = Duration::from_millis(400);
        let parts = TtftParts::split(ttft, Some(Duration::from_millis(200)), Some(engine));
        let sum: f64 = parts.each().iter().map(|(_, v)| v.unwrap()).sum();
        assert!((sum - 0.4).abs() < 1e-9, "{parts:?}");
        assert!((parts.coordination.unwrap() - 0.07).abs() < 1e-9);
        let unrelayed = TtftParts::split(ttft, None, Some(engine));
        assert_eq!(
            (unrelayed.prefill, unrelayed.coordination),
            (None, None),
            "never a guess"
        );
        assert_eq!(unrelayed.decode_queue, Some(0.05));
        let silent_engine = TtftParts::split(ttft, Some(Duration::from_millis(200)), None);
        assert_eq!(silent_engine.coordination, None);
    }

    #[test]
    fn engine_parts_that_do_not_fit_the_ttft_are_unmeasured() {
        let ttft = Duration::from_millis(400);
        let relayed = Some(Duration::from_millis(200));
        let engine = |queue: f64| EngineTiming {
            queue: Some(queue),
            prefill: Some(0.08),
            ..EngineTiming::default()
        };
        // A queue past the TTFT (1e300 ms, or 5 s) is no part: it can move no breach's cause.
        for queue in [1e297, 5.0, -1.0, f64::NAN] {
            let parts = TtftParts::split(ttft, relayed, Some(engine(queue)));
            assert_eq!((parts.decode_queue, parts.coordination), (None, None), "{queue}");
            assert_eq!(parts.prefill, Some(0.2), "the relay's own measure stands");
        }
        // Each fits alone, but with the relayed prefill they add up past the TTFT.
        let parts = TtftParts::split(ttft, relayed, Some(engine(0.15)));
        assert_eq!(
            (parts.decode_queue, parts.kv_transfer, parts.coordination),
            (None, None, None)
        );
        let sum: f64 = TtftParts::split(ttft, relayed, Some(engine(0.1)))
            .each()
            .iter()
            .map(|(_, v)| v.unwrap())
            .sum();
        assert!((sum - 0.4).abs() < 1e-9);
    }

    #[test]
    fn roles_come_from_llm_d_pod_labels() {
        assert_eq!(Role::from_label("prefill"), Some(Role::Prefill));
        assert_eq!(Role::from_label("decode"), Some(Role::Decode));
        assert_eq!(Role::from_label("both"), Some(Role::Aggregated));
        assert_eq!(Role::from_label("encode"), None);
        assert_eq!(Role::from_name("aggregated"), Some(Role::Aggregated));
        assert_eq!(Role::from_name("both"), None, "a label's word, not a role's name");
    }
}
