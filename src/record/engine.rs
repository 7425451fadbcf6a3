//! The engine behind the sidecar: its kind, its own account of a request, and what its
//! `/metrics` showed around one.

/// The `provider` label value before the engine is known.
pub const UNKNOWN_PROVIDER: &str = "unknown";

/// A known engine kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// vLLM.
    Vllm,
    /// Text Generation Inference.
    Tgi,
    /// SGLang.
    Sglang,
    /// llama.cpp server.
    Llamacpp,
    /// Any other OpenAI-compatible engine.
    Openai,
}

impl Engine {
    /// The `provider` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Tgi => "tgi",
            Engine::Sglang => "sglang",
            Engine::Llamacpp => "llamacpp",
            Engine::Openai => "openai",
        }
    }
}

impl Engine {
    /// The `provider` label value of an engine that may not be known yet.
    pub fn label(engine: Option<Engine>) -> &'static str {
        engine.map_or(UNKNOWN_PROVIDER, Engine::as_str)
    }
}

/// Whose fault an error reported inside a successful answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request was invalid (code 400/422, `invalid_request_error`, `BadRequestError`):
    /// `client_error`, never counted against the engine.
    Client,
    /// Overload, an internal error, or anything not known to be the client's: `upstream_error`.
    Engine,
}

/// The engine's own account of one request, where its answer states one (vLLM's per-request
/// metrics: `metrics` in the usage chunk or in `response.completed`), in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineTiming {
    /// Time in the engine's queue, from entering it to being scheduled (`queue_time_ms`).
    pub queue: Option<f64>,
    /// From being scheduled to the first token: prefill, and the steps it shared
    /// (`time_to_first_token_ms`, which vLLM counts from scheduling).
    pub prefill: Option<f64>,
    /// Mean time between output tokens inside the engine (`mean_itl_ms`).
    pub tpot: Option<f64>,
    /// Share of draft tokens accepted by speculative decoding
    /// (`speculative_decoding.draft_acceptance_rate`).
    pub draft_acceptance: Option<f64>,
    /// Fields the engine stated that could not be read (not a number, not finite, out of
    /// range): each left out on its own, never the event.
    pub unreadable: u32,
}

impl EngineTiming {
    /// The engine's time to first token: its queue and its prefill, when it states both.
    pub fn ttft(&self) -> Option<f64> {
        Some(self.queue? + self.prefill?)
    }

    /// The time outside the engine, in seconds, of a request llmslo saw take `ttft` to its
    /// first token: llmslo's TTFT minus the engine's (never below 0), when both are known.
    pub fn outside(&self, ttft: Option<std::time::Duration>) -> Option<f64> {
        Some((ttft?.as_secs_f64() - self.ttft()?).max(0.0))
    }
}

/// What the engine looked like at one moment, for a request's diagnosis.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineMoment {
    /// Requests waiting in its queue.
    pub waiting: Option<f64>,
    /// Preemptions since it started.
    pub preemptions: Option<f64>,
    /// Requests it runs at once (its batch).
    pub running: Option<f64>,
}

/// What the engine's pages showed around one request: the last page before it arrived, and
/// the last before it ended.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineContext {
    /// Requests waiting in the engine's queue when it arrived.
    pub waiting_at_arrival: Option<f64>,
    /// The engine preempted requests while it ran (engine-wide: not necessarily this one).
    pub preemptions_during: bool,
    /// The most requests the engine ran at once on those two pages: two or more show it
    /// batching.
    pub running: Option<f64>,
}

impl EngineContext {
    /// The context of a request that arrived at `arrival` and ended at `end`.
    pub fn between(arrival: EngineMoment, end: EngineMoment) -> Self {
        Self {
            waiting_at_arrival: arrival.waiting,
            preemptions_during: matches!((arrival.preemptions, end.preemptions), (Some(a), Some(b)) if b > a),
            running: match (arrival.running, end.running) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }
}
