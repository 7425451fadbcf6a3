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

/// How far the engine's clock may read past llmslo's for the same interval (engines round
/// their figures to the millisecond).
const CLOCK_SLACK_SECONDS: f64 = 0.001;

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
    /// Fields the engine stated that contradict what llmslo measured of the same request (a
    /// queue or prefill longer than the TTFT llmslo saw, a mean gap longer than the whole
    /// answer): left out, never taken over llmslo's own clock.
    pub inconsistent: u32,
}

impl EngineTiming {
    /// The engine's time to first token: its queue and its prefill, when it states both.
    pub fn ttft(&self) -> Option<f64> {
        Some(self.queue? + self.prefill?)
    }

    /// The figures that fit what llmslo measured of the request: its TTFT (or, without one,
    /// its whole `e2e`) holds the engine's queue and prefill, together and each alone, and the
    /// whole answer holds its mean gap. What does not fit is left out and counted.
    pub fn consistent_with(self, ttft: Option<std::time::Duration>, e2e: std::time::Duration) -> Self {
        let bound = ttft.unwrap_or(e2e).as_secs_f64() + CLOCK_SLACK_SECONDS;
        let whole = e2e.as_secs_f64() + CLOCK_SLACK_SECONDS;
        let mut inconsistent = self.inconsistent;
        let mut keep = |figure: Option<f64>, fits: bool| {
            if figure.is_some() && !fits {
                inconsistent += 1;
                return None;
            }
            figure
        };
        let queue = keep(self.queue, self.queue.is_none_or(|q| q <= bound));
        let prefill = keep(self.prefill, self.prefill.is_none_or(|p| p <= bound));
        let together = !matches!((queue, prefill), (Some(q), Some(p)) if q + p > bound);
        let (queue, prefill) = (keep(queue, together), keep(prefill, together));
        let tpot = keep(self.tpot, self.tpot.is_none_or(|t| t <= whole));
        let checked = Self { inconsistent, ..self };
        Self {
            queue,
            prefill,
            tpot,
            ..checked
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_engines_figures_are_kept_only_where_they_fit_what_llmslo_measured() {
        let stated = |queue: f64, prefill: f64, tpot: f64| EngineTiming {
            queue: Some(queue),
            prefill: Some(prefill),
            tpot: Some(tpot),
            ..EngineTiming::default()
        };
        let (ttft, e2e) = (Some(Duration::from_millis(400)), Duration::from_secs(2));
        let fits = stated(0.05, 0.1, 0.02);
        assert_eq!(fits.consistent_with(ttft, e2e), fits);
        // The hostile engine of the review: a queue of 1e300 ms, and one of 5 s.
        for queue in [1e297, 5.0] {
            let checked = stated(queue, 0.1, 0.02).consistent_with(ttft, e2e);
            assert_eq!(
                (checked.queue, checked.prefill, checked.inconsistent),
                (None, Some(0.1), 1),
                "{queue}"
            );
        }
        let together = stated(0.3, 0.3, 0.02).consistent_with(ttft, e2e);
        assert_eq!(
            (together.queue, together.prefill, together.inconsistent),
            (None, None, 2)
        );
        let gap = stated(0.05, 0.1, 3.0).consistent_with(ttft, e2e);
        assert_eq!((gap.tpot, gap.inconsistent), (None, 1));
        // Without a TTFT (an answer not streamed), the whole request bounds the queue.
        assert_eq!(stated(1.5, 0.1, 0.02).consistent_with(None, e2e).queue, Some(1.5));
        // A millisecond of rounding is the engine's clock, not a contradiction.
        assert_eq!(stated(0.2, 0.2005, 0.02).consistent_with(ttft, e2e).inconsistent, 0);
    }
}
