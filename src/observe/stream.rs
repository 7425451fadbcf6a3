//! The streaming observer: SSE parsing plus interpretation plus timestamps for one response.

use super::openai::{summarise, Usage};
use super::sse::SseParser;
use std::time::Duration;
use tokio::time::Instant;

/// Timing and token facts gathered from one OpenAI-compatible SSE response.
#[derive(Debug)]
pub struct StreamObserver {
    parser: SseParser,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    token_events: u64,
    explicit_tokens: u64,
    usage: Option<Usage>,
    saw_error: bool,
    saw_done: bool,
}

/// What the stream showed once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    /// When the first visible token was forwarded.
    pub first_token: Option<Instant>,
    /// Time per output token, with at least two token events.
    pub tpot: Option<Duration>,
    /// Output tokens: usage when reported, else counted.
    pub output_tokens: Option<u64>,
    /// Input tokens from usage.
    pub input_tokens: Option<u64>,
    /// Events that carried tokens.
    pub token_events: u64,
    /// An error payload arrived.
    pub saw_error: bool,
    /// The `[DONE]` sentinel arrived.
    pub saw_done: bool,
    /// An oversized event stopped interpretation part-way.
    pub gave_up: bool,
}

impl StreamObserver {
    /// An observer whose parser gives up on events over `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            parser: SseParser::new(max_event_bytes),
            first_token: None,
            last_token: None,
            token_events: 0,
            explicit_tokens: 0,
            usage: None,
            saw_error: false,
            saw_done: false,
        }
    }

    /// Feeds bytes forwarded at `now`; `on_gap` gets each inter-chunk gap they complete.
    pub fn feed(&mut self, bytes: &[u8], now: Instant, mut on_gap: impl FnMut(Duration)) {
        let Self {
            parser,
            first_token,
            last_token,
            token_events,
            explicit_tokens,
            usage,
            saw_error,
            saw_done,
        } = self;
        parser.feed(bytes, |event| {
            let summary = summarise(event.data);
            if summary.usage.is_some() {
                *usage = summary.usage;
            }
            *saw_error |= summary.error;
            *saw_done |= summary.done;
            if !summary.has_tokens {
                return;
            }
            *token_events += 1;
            *explicit_tokens += summary.explicit_tokens.unwrap_or(1);
            if first_token.is_none() && !summary.visible {
                return; // held-back text before the first visible token
            }
            first_token.get_or_insert(now);
            if let Some(previous) = last_token.replace(now) {
                on_gap(now - previous);
            }
        });
    }

    /// What the stream showed, to be called once it ended.
    pub fn summary(&self) -> StreamSummary {
        let usage = self.usage.unwrap_or_default();
        let output_tokens = usage
            .completion_tokens
            .or((self.token_events > 0).then_some(self.explicit_tokens));
        let tpot = match (self.first_token, self.last_token, output_tokens) {
            (Some(first), Some(last), Some(n)) if n >= 2 && last > first => {
                Some((last - first).div_f64((n - 1) as f64))
            }
            _ => None,
        };
        StreamSummary {
            first_token: self.first_token,
            tpot,
            output_tokens,
            input_tokens: usage.prompt_tokens,
            token_events: self.token_events,
            saw_error: self.saw_error,
            saw_done: self.saw_done,
            gave_up: self.parser.gave_up(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ttft_tpot_and_gaps_from_timed_events() {
        let t0 = Instant::now();
        let mut obs = StreamObserver::new(1 << 20);
        let mut gaps = Vec::new();
        let role = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        obs.feed(role, t0, |g| gaps.push(g));
        for i in 1..=4u64 {
            let now = t0 + Duration::from_millis(100 + 20 * (i - 1));
            obs.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n", now, |g| {
                gaps.push(g)
            });
        }
        obs.feed(b"data: [DONE]\n\n", t0 + Duration::from_millis(170), |g| gaps.push(g));
        let s = obs.summary();
        assert_eq!(s.first_token, Some(t0 + Duration::from_millis(100)));
        assert_eq!(s.output_tokens, Some(4));
        assert_eq!(s.tpot, Some(Duration::from_millis(20)));
        assert_eq!(gaps, vec![Duration::from_millis(20); 3]);
        assert!(s.saw_done && !s.saw_error);
    }

    #[tokio::test(start_paused = true)]
    async fn usage_overrides_the_event_count() {
        let t0 = Instant::now();
        let mut obs = StreamObserver::new(1 << 20);
        obs.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}\n\n",
            t0,
            |_| {},
        );
        obs.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"def\"}}]}\n\n",
            t0 + Duration::from_millis(90),
            |_| {},
        );
        obs.feed(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n",
            t0 + Duration::from_millis(91),
            |_| {},
        );
        let s = obs.summary();
        assert_eq!(s.output_tokens, Some(6));
        assert_eq!(s.input_tokens, Some(5));
        assert_eq!(s.tpot, Some(Duration::from_millis(18)));
        assert_eq!(s.token_events, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn single_token_event_has_no_tpot() {
        let t0 = Instant::now();
        let mut obs = StreamObserver::new(1 << 20);
        obs.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
            t0,
            |_| {},
        );
        assert_eq!(obs.summary().tpot, None);
        assert_eq!(obs.summary().output_tokens, Some(1));
    }
}
