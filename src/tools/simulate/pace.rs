//! When a simulated response's next tokens are ready, and the engine's own timing of it.

use super::batching::Step;
use super::delay::Delay;
use rand::rngs::SmallRng;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

/// When a response's next tokens are ready.
pub(super) enum Pacer {
    /// Fixed (or sampled) delays: the first chunk at `due`, then a TPOT per token.
    Delays { due: Instant, tpot: Delay, per_chunk: u32 },
    /// The batching loop's steps.
    Batch(mpsc::UnboundedReceiver<Step>),
}

impl Pacer {
    /// Waits for the next chunk: its tokens (at most `remaining`) and when the request was
    /// scheduled (`None` outside batching: never queued), or `None` when the engine stopped.
    pub(super) async fn next(&mut self, remaining: u32, rng: &mut SmallRng) -> Option<(u32, Option<Instant>)> {
        match self {
            Pacer::Delays { due, tpot, per_chunk } => {
                sleep_until(*due).await;
                for _ in 0..*per_chunk {
                    *due += tpot.sample(rng);
                }
                Some(((*per_chunk).min(remaining), None))
            }
            Pacer::Batch(ticks) => ticks.recv().await.map(|step| (step.tokens, Some(step.scheduled))),
        }
    }
}

/// The engine's own timing of one request, as vLLM's per-request metrics state it.
#[derive(Debug, Clone, Copy)]
pub(super) struct EngineClock {
    queued: Instant,
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl EngineClock {
    pub(super) fn start() -> Self {
        Self {
            queued: Instant::now(),
            scheduled: None,
            first_token: None,
            last_token: None,
        }
    }

    /// Notes a step that arrived now, of a request scheduled at `scheduled`.
    pub(super) fn step(&mut self, scheduled: Option<Instant>) {
        let now = Instant::now();
        self.scheduled.get_or_insert(scheduled.unwrap_or(self.queued));
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
    }

    /// The `metrics` object of a request that generated `tokens` per choice, `per_step` at a
    /// time (more than one: speculative decoding, stated as `per_step` draft tokens a step of
    /// which all but the bonus token were accepted).
    pub(super) fn metrics(&self, tokens: u32, per_step: u32) -> serde_json::Value {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let scheduled = self.scheduled.unwrap_or(self.queued);
        let first = self.first_token.unwrap_or(scheduled);
        let last = self.last_token.unwrap_or(first);
        let mean_itl = (tokens > 1).then(|| ms(last - first) / f64::from(tokens - 1));
        let speculation = (per_step > 1).then(|| {
            serde_json::json!({
                "mean_acceptance_length": per_step,
                "draft_acceptance_rate": f64::from(per_step - 1) / f64::from(per_step),
            })
        });
        serde_json::json!({
            "time_to_first_token_ms": ms(first - scheduled),
            "generation_time_ms": ms(last - first),
            "queue_time_ms": ms(scheduled - self.queued),
            "mean_itl_ms": mean_itl,
            "tokens_per_second": null,
            "speculative_decoding": speculation,
        })
    }
}
