//! The streaming observer: SSE parsing plus interpretation plus timestamps for one response.

use super::openai::{self, EventSummary, Usage};
use super::record::Protocol;
use super::sse::SseParser;
use super::tgi;
use std::time::Duration;
use tokio::time::Instant;

/// Choices tracked one by one for `n > 1`; tokens of higher indices still count in N.
const MAX_CHOICES: usize = 64;

/// Timing and token facts gathered from one streamed response.
#[derive(Debug)]
pub struct StreamObserver {
    protocol: Protocol,
    parser: SseParser,
    facts: Facts,
    /// Spans of usage-only events to cut from what the client receives (when it did not ask).
    removable: Option<Vec<(u64, u64)>>,
}

/// What the events have shown so far (kept apart from the parser, which feeds it).
#[derive(Debug, Default)]
struct Facts {
    first_token: Option<Instant>,
    first_token_event: Option<Instant>,
    choices: Vec<ChoiceTiming>,
    token_events: u64,
    explicit_tokens: u64,
    usage: Option<Usage>,
    saw_error: bool,
    saw_done: bool,
}

/// One choice's token timestamps.
#[derive(Debug, Clone, Copy, Default)]
struct ChoiceTiming {
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u64,
}

/// Where the token count came from, for the debug log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountSource {
    /// The engine's `usage.completion_tokens` (or TGI's `details.generated_tokens`).
    Usage,
    /// Counted from the events (`token_ids`/`logprobs` lengths, else one per token event).
    Events,
}

/// What the stream showed once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    /// When the first visible token (of any choice) was forwarded.
    pub first_token: Option<Instant>,
    /// When the first token-carrying event was forwarded, visible or not (held-back partial
    /// UTF-8, a special token): what clients that stamp the first chunk call TTFT.
    pub first_token_event: Option<Instant>,
    /// TPOT of each choice with at least two token events, timed from its first
    /// token-carrying event (visible or not) to its last.
    pub tpot_per_choice: Vec<Duration>,
    /// Output tokens: usage when reported, else counted.
    pub output_tokens: Option<u64>,
    /// Where `output_tokens` came from.
    pub count_source: CountSource,
    /// Input tokens from usage.
    pub input_tokens: Option<u64>,
    /// Events that carried tokens.
    pub token_events: u64,
    /// An error payload arrived.
    pub saw_error: bool,
    /// The end-of-stream signal arrived (`[DONE]`, or TGI's final event).
    pub saw_done: bool,
    /// An oversized event stopped interpretation part-way.
    pub gave_up: bool,
}

impl StreamObserver {
    /// An observer for `protocol` whose parser gives up on events over `max_event_bytes`;
    /// with `strip_usage`, usage-only events are marked for removal.
    pub fn new(protocol: Protocol, max_event_bytes: usize, strip_usage: bool) -> Self {
        Self {
            protocol,
            parser: SseParser::new(max_event_bytes),
            facts: Facts::default(),
            removable: strip_usage.then(Vec::new),
        }
    }

    /// Feeds bytes forwarded at `now`; `on_gap` gets each inter-chunk gap they complete.
    pub fn feed(&mut self, bytes: &[u8], now: Instant, mut on_gap: impl FnMut(Duration)) {
        let Self {
            protocol,
            parser,
            facts,
            removable,
        } = self;
        parser.feed(bytes, |event| {
            let summary = match protocol {
                Protocol::OpenAi => openai::summarise(event.data),
                Protocol::Tgi => tgi::summarise(event.data),
            };
            if let (true, Some(spans)) = (summary.usage_only, removable.as_mut()) {
                spans.push((event.start, event.end));
            }
            facts.observe(&summary, now, &mut on_gap);
        });
    }

    /// Stream offset up to which every event is complete, or `None` once interpretation
    /// stopped (everything may then be forwarded).
    pub fn boundary(&self) -> Option<u64> {
        (!self.parser.gave_up()).then(|| self.parser.boundary())
    }

    /// Takes the spans of usage-only events found so far that must not reach the client.
    pub fn take_removable(&mut self) -> Vec<(u64, u64)> {
        self.removable.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// What the stream showed, to be called once it ended.
    pub fn summary(&self) -> StreamSummary {
        let usage = self.facts.usage.unwrap_or_default();
        let (output_tokens, count_source) = match usage.completion_tokens {
            Some(n) => (Some(n), CountSource::Usage),
            None => (
                (self.facts.token_events > 0).then_some(self.facts.explicit_tokens),
                CountSource::Events,
            ),
        };
        let active: Vec<&ChoiceTiming> = self.facts.choices.iter().filter(|c| c.tokens > 0).collect();
        let tpot_per_choice = match active.as_slice() {
            // One choice: N may come from usage.
            [only] => tpot(only.first, only.last, output_tokens.unwrap_or(only.tokens))
                .into_iter()
                .collect(),
            // Several: usage counts them all together, so each uses its own count.
            many => many.iter().filter_map(|c| tpot(c.first, c.last, c.tokens)).collect(),
        };
        StreamSummary {
            first_token: self.facts.first_token,
            first_token_event: self.facts.first_token_event,
            tpot_per_choice,
            output_tokens,
            count_source,
            input_tokens: usage.prompt_tokens,
            token_events: self.facts.token_events,
            saw_error: self.facts.saw_error,
            saw_done: self.facts.saw_done,
            gave_up: self.parser.gave_up(),
        }
    }
}

/// (t_last − t_first) / (N − 1), when two distinct token times and N ≥ 2 exist.
fn tpot(first: Option<Instant>, last: Option<Instant>, n: u64) -> Option<Duration> {
    match (first, last) {
        (Some(first), Some(last)) if n >= 2 && last > first => Some((last - first).div_f64((n - 1) as f64)),
        _ => None,
    }
}

impl Facts {
    fn observe(&mut self, summary: &EventSummary, now: Instant, on_gap: &mut impl FnMut(Duration)) {
        if summary.usage.is_some() {
            self.usage = summary.usage;
        }
        self.saw_error |= summary.error;
        self.saw_done |= summary.done;
        if !summary.has_tokens {
            return;
        }
        let tokens = summary.explicit_tokens.unwrap_or(1);
        self.first_token_event.get_or_insert(now);
        self.token_events += 1;
        self.explicit_tokens += tokens;
        let index = summary.choice as usize;
        if index >= MAX_CHOICES {
            return;
        }
        if self.choices.len() <= index {
            self.choices.resize(index + 1, ChoiceTiming::default());
        }
        if summary.visible {
            self.first_token.get_or_insert(now);
        }
        // Decode timing counts every generated token, held-back text and special tokens too:
        // N includes them, so the first of them starts the (N - 1) decode steps.
        let choice = &mut self.choices[index];
        choice.tokens += tokens;
        choice.first.get_or_insert(now);
        if let Some(previous) = choice.last.replace(now) {
            on_gap(now - previous);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observer() -> StreamObserver {
        StreamObserver::new(Protocol::OpenAi, 1 << 20, false)
    }

    #[tokio::test(start_paused = true)]
    async fn ttft_tpot_and_gaps_from_timed_events() {
        let t0 = Instant::now();
        let mut obs = observer();
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
        assert_eq!(s.count_source, CountSource::Events);
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(20)]);
        assert_eq!(gaps, vec![Duration::from_millis(20); 3]);
        assert!(s.saw_done && !s.saw_error);
    }

    #[tokio::test(start_paused = true)]
    async fn usage_overrides_the_event_count() {
        let t0 = Instant::now();
        let mut obs = observer();
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
        assert_eq!(s.count_source, CountSource::Usage);
        assert_eq!(s.input_tokens, Some(5));
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(18)]);
        assert_eq!(s.token_events, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn single_token_event_has_no_tpot() {
        let t0 = Instant::now();
        let mut obs = observer();
        obs.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
            t0,
            |_| {},
        );
        assert!(obs.summary().tpot_per_choice.is_empty());
        assert_eq!(obs.summary().output_tokens, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_back_start_delays_ttft_but_not_the_decode_clock() {
        let t0 = Instant::now();
        let mut obs = observer();
        let held = b"data: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\n";
        let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"\xc3\xa9\"}}]}\n\n";
        obs.feed(held, t0 + Duration::from_millis(100), |_| {});
        obs.feed(token, t0 + Duration::from_millis(130), |_| {});
        obs.feed(token, t0 + Duration::from_millis(160), |_| {});
        let s = obs.summary();
        assert_eq!(
            s.first_token,
            Some(t0 + Duration::from_millis(130)),
            "TTFT: the first thing a user sees"
        );
        assert_eq!(s.first_token_event, Some(t0 + Duration::from_millis(100)));
        assert_eq!(s.output_tokens, Some(3));
        assert_eq!(
            s.tpot_per_choice,
            [Duration::from_millis(30)],
            "three tokens, two decode steps of 30 ms"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn choices_are_timed_separately() {
        let t0 = Instant::now();
        let mut obs = observer();
        let mut gaps = Vec::new();
        let at = |ms| t0 + Duration::from_millis(ms);
        let chunk = |i: u32| format!("data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}}}}]}}\n\n");
        // Choice 1 starts first and streams every 10 ms; choice 0 every 30 ms.
        for (ms, i) in [(50, 1), (60, 1), (70, 1), (80, 0), (110, 0), (140, 0)] {
            obs.feed(chunk(i).as_bytes(), at(ms), |g| gaps.push(g));
        }
        let s = obs.summary();
        assert_eq!(s.first_token, Some(at(50)));
        assert_eq!(
            s.tpot_per_choice,
            [Duration::from_millis(30), Duration::from_millis(10)]
        );
        assert_eq!(gaps.len(), 4);
        assert_eq!(s.output_tokens, Some(6));
    }

    #[tokio::test(start_paused = true)]
    async fn tgi_stream_special_tokens_and_final_event() {
        let t0 = Instant::now();
        let mut obs = StreamObserver::new(Protocol::Tgi, 1 << 20, false);
        let event = |special: bool, last: bool| {
            format!(
                "data:{{\"index\":1,\"token\":{{\"id\":1,\"text\":\"a\",\"logprob\":0.0,\"special\":{special}}},\"generated_text\":{},\"details\":{}}}\n\n",
                if last { "\"aaa\"" } else { "null" },
                if last { "{\"generated_tokens\":3}" } else { "null" },
            )
        };
        obs.feed(event(true, false).as_bytes(), t0, |_| {});
        obs.feed(event(false, false).as_bytes(), t0 + Duration::from_millis(40), |_| {});
        obs.feed(event(false, true).as_bytes(), t0 + Duration::from_millis(60), |_| {});
        let s = obs.summary();
        assert_eq!(
            s.first_token,
            Some(t0 + Duration::from_millis(40)),
            "the special token is not content"
        );
        assert_eq!(s.output_tokens, Some(3));
        assert_eq!(
            s.tpot_per_choice,
            [Duration::from_millis(30)],
            "three tokens over 60 ms: decode starts at the first"
        );
        assert!(s.saw_done);
    }

    #[test]
    fn usage_only_spans_are_marked_only_when_stripping() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
        let mut keep = observer();
        keep.feed(stream, Instant::now(), |_| {});
        assert!(keep.take_removable().is_empty());
        let mut strip = StreamObserver::new(Protocol::OpenAi, 1 << 20, true);
        strip.feed(stream, Instant::now(), |_| {});
        let spans = strip.take_removable();
        assert_eq!(spans.len(), 1);
        let (start, end) = (spans[0].0 as usize, spans[0].1 as usize);
        assert!(stream[start..end].starts_with(b"data: {\"choices\":[],\"usage\""));
        assert!(stream[end..].starts_with(b"data: [DONE]"));
        assert_eq!(strip.boundary(), Some(stream.len() as u64));
    }
}
