//! The streaming observer: SSE parsing plus interpretation plus timestamps for one response.

use super::event::{EventSummary, Usage};
use super::repeat::RepeatSummariser;
use super::sse::SseParser;
use super::steps::DecodeSteps;
use super::tokens::TokenCounter;
use super::{messages, openai, responses};
use crate::record::Protocol;
use crate::record::{CountSource, EngineTiming, Fault, Outcome, RequestRecord};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Choices tracked one by one for `n > 1`; tokens of higher indices still count in N.
const MAX_CHOICES: usize = 64;
/// Generated text kept per response for a tokenizer to count; beyond it the count is unknown.
const MAX_TEXT_BYTES: usize = 4 << 20;

/// How tokens that the stream does not state are counted.
#[derive(Debug, Clone, Default)]
pub struct Counting {
    /// A final event with empty text and a finish reason carries no token (llama.cpp); for
    /// vLLM it is the last token, its text held back.
    pub empty_finish_is_no_token: bool,
    /// The model's tokenizer, for streams that state no counts.
    pub tokenizer: Option<Arc<TokenCounter>>,
}

/// Timing and token facts gathered from one streamed response.
#[derive(Debug)]
pub struct StreamObserver {
    protocol: Protocol,
    parser: SseParser,
    /// The protocol's interpreter, skipped where an event repeats an earlier shape.
    repeat: RepeatSummariser,
    counting: Counting,
    facts: Facts,
    /// Spans of usage-only events to cut from what the client receives (when it did not ask).
    removable: Option<Vec<(u64, u64)>>,
}

/// What the events have shown so far (kept apart from the parser, which feeds it).
#[derive(Debug, Default)]
struct Facts {
    first_token: Option<Instant>,
    first_token_event: Option<Instant>,
    first_answer: Option<Instant>,
    /// An event sent with the first generated token although it carries no text (§3).
    first_token_mark: Option<Instant>,
    /// The first event since the last token event that closes generated output: when the
    /// last token was generated, if its text was held back.
    generation_end: Option<Instant>,
    choices: Vec<ChoiceFacts>,
    token_events: u64,
    /// Tokens the events stated (`token_ids`, `logprobs`, TGI's one-token events).
    stated_tokens: u64,
    /// Token events that stated no count.
    unstated_events: u64,
    /// Read each choice's gaps as decode steps: its deltas may hold back tokens.
    count_steps: bool,
    /// Generated text went past what is kept (or past the tracked choices).
    text_overflow: bool,
    text_bytes: usize,
    usage: Option<Usage>,
    engine: Option<EngineTiming>,
    error: Option<Fault>,
    saw_done: bool,
}

/// One choice's token timestamps and counts.
#[derive(Debug, Clone, Default)]
struct ChoiceFacts {
    first: Option<Instant>,
    last: Option<Instant>,
    events: u64,
    stated: u64,
    unstated_events: u64,
    /// Characters of text its first token event carried, and all its events (where the
    /// protocol states them).
    first_chars: u32,
    chars: u64,
    /// Its generated text, kept only for a tokenizer.
    text: String,
    /// How much of `text` its first token event carried.
    first_text_bytes: usize,
    /// The gaps between its deltas as decode steps (Responses and Messages only).
    steps: DecodeSteps,
}

/// What the stream showed once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    /// When the first visible token (of any choice) was forwarded.
    pub first_token: Option<Instant>,
    /// When the first token-carrying event was forwarded, visible or not (held-back partial
    /// UTF-8, a special token): what clients that stamp the first chunk call TTFT.
    pub first_token_event: Option<Instant>,
    /// When the first token of the answer itself (not reasoning, not a tool call) was forwarded.
    pub first_answer_token: Option<Instant>,
    /// TPOT of each choice whose token count is known and that had two token events, timed
    /// from its first token-carrying event (visible or not) to its last.
    pub tpot_per_choice: Vec<Duration>,
    /// Output tokens, when known.
    pub output_tokens: Option<u64>,
    /// Where `output_tokens` came from; `None` when nothing was generated or reported.
    pub count_source: Option<CountSource>,
    /// Input tokens from usage.
    pub input_tokens: Option<u64>,
    /// Output tokens spent on reasoning, from usage.
    pub reasoning_tokens: Option<u64>,
    /// The engine's own timing of the request, where the stream stated it.
    pub engine: Option<EngineTiming>,
    /// Events that carried tokens.
    pub token_events: u64,
    /// An error payload arrived, and whose fault it says it is (the engine's, when several
    /// disagree).
    pub error: Option<Fault>,
    /// The end-of-stream signal arrived (`[DONE]`, TGI's final event, a Responses terminal
    /// event, `message_stop`).
    pub saw_done: bool,
    /// An oversized event stopped interpretation part-way.
    pub gave_up: bool,
}

impl StreamSummary {
    /// Writes the stream's measurements into `record`, timed from the request head at `t0`;
    /// returns the outcome the events imply when they show a failure (an error payload: the
    /// client's fault or the engine's; or a stream cut short before its end signal).
    pub fn apply_to(self, record: &mut RequestRecord, t0: Instant) -> Option<Outcome> {
        record.ttft = self.first_token.map(|first| first - t0);
        record.answer_ttft = self.first_answer_token.map(|first| first - t0);
        record.tpot_per_choice = self.tpot_per_choice;
        record.count_source = self.count_source;
        record.output_tokens = self.output_tokens;
        record.input_tokens = self.input_tokens;
        record.reasoning_tokens = self.reasoning_tokens;
        record.engine = self.engine;
        record.token_events = self.token_events;
        let cut_short = !self.saw_done && !self.gave_up;
        match self.error {
            Some(fault) => Some(Outcome::of_fault(fault)),
            None => cut_short.then_some(Outcome::UpstreamError),
        }
    }
}

impl StreamObserver {
    /// An observer for `protocol` whose parser gives up on events over `max_event_bytes`;
    /// with `strip_usage`, usage-only events are marked for removal.
    pub fn new(protocol: Protocol, max_event_bytes: usize, strip_usage: bool) -> Self {
        Self {
            protocol,
            parser: SseParser::new(max_event_bytes),
            repeat: RepeatSummariser::new(protocol),
            counting: Counting::default(),
            facts: Facts {
                count_steps: matches!(protocol, Protocol::Responses | Protocol::Messages),
                ..Facts::default()
            },
            removable: strip_usage.then(Vec::new),
        }
    }

    /// Counts tokens the stream does not state as `counting` says.
    pub fn with_counting(mut self, counting: Counting) -> Self {
        self.counting = counting;
        self
    }

    /// Feeds bytes forwarded at `now`; `on_gap` gets each inter-chunk gap they complete.
    pub fn feed(&mut self, bytes: &[u8], now: Instant, mut on_gap: impl FnMut(Duration)) {
        let Self {
            protocol,
            parser,
            repeat,
            counting,
            facts,
            removable,
        } = self;
        parser.feed(bytes, |event| {
            let mut summary = repeat.summarise(event.event_type, event.data);
            if let (true, Some(spans)) = (summary.usage_only, removable.as_mut()) {
                spans.push((event.start, event.end));
            }
            if event.after_oversized {
                return; // no longer measured: framed only to cut the usage chunk
            }
            if summary.finish_only && counting.empty_finish_is_no_token {
                summary.has_tokens = false;
            }
            let keep_text = counting.tokenizer.is_some() && summary.has_tokens && summary.explicit_tokens.is_none();
            facts.observe(&summary, now, &mut on_gap);
            if keep_text {
                match protocol {
                    Protocol::OpenAi => {
                        openai::generated_text(event.data, |choice, text| facts.keep_text(choice, text))
                    }
                    Protocol::Responses => responses::generated_text(event.data, |text| facts.keep_text(0, text)),
                    Protocol::Messages => messages::generated_text(event.data, |text| facts.keep_text(0, text)),
                    Protocol::Tgi => {}
                }
            }
        });
    }

    /// When the first token-carrying event was fed, if one was.
    pub fn first_token_event(&self) -> Option<Instant> {
        self.facts.first_token_event
    }

    /// Stream offset up to which the bytes may be forwarded: every event before it is
    /// complete (inside an oversized event, everything fed so far).
    pub fn boundary(&self) -> u64 {
        self.parser.boundary()
    }

    /// Takes the spans of usage-only events found so far that must not reach the client.
    pub fn take_removable(&mut self) -> Vec<(u64, u64)> {
        self.removable.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// What the stream showed, to be called once it ended.
    pub fn summary(&self) -> StreamSummary {
        let facts = &self.facts;
        let usage = facts.usage.unwrap_or_default();
        let active: Vec<&ChoiceFacts> = facts.choices.iter().filter(|c| c.events > 0).collect();
        let tokenized = self.tokenized(&active);
        let (output_tokens, count_source) = match (usage.output_tokens, tokenized.as_ref()) {
            (Some(n), _) => (Some(n), Some(CountSource::Usage)),
            _ if facts.token_events == 0 => (None, None),
            (None, _) if facts.unstated_events == 0 => (Some(facts.stated_tokens), Some(CountSource::TokenIds)),
            (None, Some(counts)) => (
                Some(facts.stated_tokens + counts.iter().sum::<u64>()),
                Some(CountSource::Tokenizer),
            ),
            (None, None) => (None, Some(CountSource::Events)),
        };
        let per_choice = match (count_source, output_tokens) {
            (Some(CountSource::Usage), Some(total)) => split_total(total, &active),
            (Some(CountSource::Tokenizer), _) => {
                let mut counts = tokenized.unwrap_or_default().into_iter();
                active
                    .iter()
                    .map(|c| Some(c.stated + if c.unstated_events > 0 { counts.next()? } else { 0 }))
                    .collect()
            }
            _ => active
                .iter()
                .map(|c| (c.unstated_events == 0).then_some(c.stated))
                .collect(),
        };
        let tpot_per_choice = active
            .iter()
            .zip(per_choice)
            .filter_map(|(c, n)| match self.protocol {
                Protocol::Responses | Protocol::Messages => self.delta_tpot(c, n?),
                Protocol::OpenAi | Protocol::Tgi => tpot(c.first, c.last, n?),
            })
            .collect();
        StreamSummary {
            first_token: facts.first_token,
            first_token_event: facts.first_token_event,
            first_answer_token: facts.first_answer,
            tpot_per_choice,
            output_tokens,
            count_source,
            input_tokens: usage.input_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            engine: facts.engine,
            token_events: facts.token_events,
            error: facts.error,
            saw_done: facts.saw_done,
            gave_up: self.parser.gave_up(),
        }
    }

    /// TPOT where the engine sends no delta for held-back tokens (Responses, Messages), so
    /// that `n` tokens arrive in fewer deltas. The decode clock starts at the first token:
    /// an event that marks it (vLLM's `message_start`), when its lead over the first delta
    /// fits the held-back tokens. Else it starts at the first delta, over the steps after it:
    /// the tokenizer's count of the first delta's text says how many tokens it carried;
    /// without one, the gap pattern says how many steps each later gap spanned
    /// ([`DecodeSteps`]), the rest of the held-back tokens being the first delta's; with too
    /// few gaps for a pattern, the first delta takes its share by characters of text. The
    /// clock stops at the last token: the last delta, or the first event after it that
    /// closes the output, when the last tokens' text was held back to the end.
    fn delta_tpot(&self, choice: &ChoiceFacts, n: u64) -> Option<Duration> {
        let (first, last_delta) = (choice.first?, choice.last?);
        let last = self.facts.generation_end.map_or(last_delta, |end| end.max(last_delta));
        let deltas = choice.events;
        let held_back = n.saturating_sub(deltas);
        let mark_fits = |mark: Instant| {
            let lead = first.saturating_duration_since(mark);
            deltas < 2
                || lead
                    <= (last - first)
                        .mul_f64(held_back as f64 + 0.5)
                        .div_f64((deltas - 1) as f64)
        };
        if let Some(mark) = self.facts.first_token_mark.filter(|&mark| mark_fits(mark)) {
            return (n > 1 && last > mark).then(|| (last - mark).div_f64((n - 1) as f64));
        }
        if let Some(carried) = self.first_delta_tokenized(choice) {
            return (n > carried && last > first).then(|| (last - first).div_f64((n - carried) as f64));
        }
        if let Some(steps) = choice.steps.count(last - last_delta) {
            let gaps = deltas - 1;
            let after_first = gaps + held_back.min(steps.between - gaps + steps.tail);
            let end = if steps.tail > 0 { last } else { last_delta };
            return (after_first > 0 && end > first).then(|| (end - first).div_f64(after_first as f64));
        }
        let carried = self.first_delta_share(choice, held_back);
        (n > carried && last > first).then(|| (last - first).div_f64((n - carried) as f64))
    }

    /// How many tokens a choice's first delta carried, by the tokenizer's count of its text.
    fn first_delta_tokenized(&self, choice: &ChoiceFacts) -> Option<u64> {
        let tokenizer = self.counting.tokenizer.as_ref().filter(|_| !self.facts.text_overflow)?;
        let first = choice.text.get(..choice.first_text_bytes).filter(|f| !f.is_empty())?;
        tokenizer.count(first).map(|tokens| tokens.max(1))
    }

    /// How many tokens a choice's first delta carried, by characters: its own token plus its
    /// share of the held-back ones.
    fn first_delta_share(&self, choice: &ChoiceFacts, held_back: u64) -> u64 {
        if choice.chars == 0 {
            return 1;
        }
        let share = f64::from(choice.first_chars) / choice.chars as f64;
        1 + (held_back as f64 * share).round() as u64
    }

    /// The tokenizer's count of each active choice's unstated tokens (in order, for those
    /// with unstated events), when a tokenizer is set and every text was kept.
    fn tokenized(&self, active: &[&ChoiceFacts]) -> Option<Vec<u64>> {
        let tokenizer = self.counting.tokenizer.as_ref()?;
        if self.facts.text_overflow || self.facts.unstated_events == 0 {
            return None;
        }
        active
            .iter()
            .filter(|c| c.unstated_events > 0)
            .map(|c| tokenizer.count(&c.text))
            .collect()
    }
}

/// Each choice's N when only the total is known: a choice whose events stated their counts
/// keeps them; the rest of the total is split over the other choices in proportion to their
/// token events (largest remainder). Exact when the engine puts the same number of tokens in
/// every event of every choice, as `--stream-interval` and speculative decoding do.
fn split_total(total: u64, active: &[&ChoiceFacts]) -> Vec<Option<u64>> {
    let stated: u64 = active.iter().filter(|c| c.unstated_events == 0).map(|c| c.stated).sum();
    let rest = total.saturating_sub(stated);
    let weights: Vec<u64> = active
        .iter()
        .map(|c| if c.unstated_events == 0 { 0 } else { c.events })
        .collect();
    let weight_sum: u64 = weights.iter().sum();
    if weight_sum == 0 {
        return active.iter().map(|c| Some(c.stated)).collect();
    }
    let mut shares: Vec<(u64, u64)> = weights
        .iter()
        .map(|w| {
            let exact = u128::from(rest) * u128::from(*w);
            (
                (exact / u128::from(weight_sum)) as u64,
                (exact % u128::from(weight_sum)) as u64,
            )
        })
        .collect();
    let mut left = rest - shares.iter().map(|s| s.0).sum::<u64>();
    let mut order: Vec<usize> = (0..shares.len()).filter(|&i| weights[i] > 0).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(shares[i].1));
    for i in order {
        if left == 0 {
            break;
        }
        shares[i].0 += 1;
        left -= 1;
    }
    active
        .iter()
        .zip(shares)
        .map(|(c, (share, _))| Some(if c.unstated_events == 0 { c.stated } else { share }))
        .collect()
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
        if let Some(usage) = summary.usage {
            self.usage = Some(self.usage.unwrap_or_default().merged(usage));
        }
        if summary.engine.is_some() {
            self.engine = summary.engine;
        }
        if let Some(fault) = summary.error {
            self.error = Some(match self.error {
                Some(Fault::Engine) => Fault::Engine,
                _ => fault,
            });
        }
        self.saw_done |= summary.done;
        if summary.first_token_mark && self.first_token_event.is_none() {
            self.first_token_mark.get_or_insert(now);
        }
        if summary.generation_end && self.first_token_event.is_some() {
            self.generation_end.get_or_insert(now);
        }
        if !summary.has_tokens {
            return;
        }
        self.generation_end = None;
        self.first_token_event.get_or_insert(now);
        self.token_events += 1;
        match summary.explicit_tokens {
            Some(n) => self.stated_tokens += n,
            None => self.unstated_events += 1,
        }
        let index = summary.choice as usize;
        if index >= MAX_CHOICES {
            self.text_overflow = true;
            return;
        }
        if self.choices.len() <= index {
            self.choices.resize(index + 1, ChoiceFacts::default());
        }
        if summary.visible {
            self.first_token.get_or_insert(now);
        }
        if summary.answer {
            self.first_answer.get_or_insert(now);
        }
        // Decode timing counts every generated token, held-back text and special tokens too:
        // N includes them, so the first of them starts the (N - 1) decode steps.
        let choice = &mut self.choices[index];
        choice.events += 1;
        match summary.explicit_tokens {
            Some(n) => choice.stated += n,
            None => choice.unstated_events += 1,
        }
        if choice.first.is_none() {
            choice.first = Some(now);
            choice.first_chars = summary.text_chars;
        }
        choice.chars += u64::from(summary.text_chars);
        if let Some(previous) = choice.last.replace(now) {
            on_gap(now - previous);
            if self.count_steps {
                choice.steps.push(now - previous);
            }
        }
    }

    /// Keeps a choice's generated text for the tokenizer, within the bound.
    fn keep_text(&mut self, choice: u32, text: &str) {
        let index = choice as usize;
        self.text_bytes += text.len();
        if self.text_bytes > MAX_TEXT_BYTES || index >= self.choices.len() {
            self.text_overflow = true;
            return;
        }
        let choice = &mut self.choices[index];
        choice.text.push_str(text);
        if choice.events == 1 {
            choice.first_text_bytes = choice.text.len();
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
            obs.feed(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"token_ids\":[7]}]}\n\n",
                now,
                |g| gaps.push(g),
            );
        }
        obs.feed(b"data: [DONE]\n\n", t0 + Duration::from_millis(170), |g| gaps.push(g));
        let s = obs.summary();
        assert_eq!(s.first_token, Some(t0 + Duration::from_millis(100)));
        assert_eq!(s.output_tokens, Some(4));
        assert_eq!(s.count_source, Some(CountSource::TokenIds));
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(20)]);
        assert_eq!(gaps, vec![Duration::from_millis(20); 3]);
        assert!(s.saw_done && s.error.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn events_alone_leave_the_count_and_tpot_unknown() {
        let t0 = Instant::now();
        let mut obs = observer();
        let mut gaps = Vec::new();
        for i in 0..4u64 {
            let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\"four tokens maybe\"}}]}\n\n";
            obs.feed(chunk, t0 + Duration::from_millis(100 + 80 * i), |g| gaps.push(g));
        }
        let s = obs.summary();
        assert_eq!(
            s.first_token,
            Some(t0 + Duration::from_millis(100)),
            "TTFT needs no count"
        );
        assert_eq!(gaps, vec![Duration::from_millis(80); 3], "nor do the gaps");
        assert_eq!(s.count_source, Some(CountSource::Events));
        assert_eq!(s.output_tokens, None, "an event may hold several tokens");
        assert!(
            s.tpot_per_choice.is_empty(),
            "no TPOT that may be a multiple of the truth"
        );
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
        assert_eq!(s.count_source, Some(CountSource::Usage));
        assert_eq!(s.input_tokens, Some(5));
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(18)]);
        assert_eq!(s.token_events, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn single_token_event_has_no_tpot() {
        let t0 = Instant::now();
        let mut obs = observer();
        obs.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"token_ids\":[1]}]}\n\ndata: [DONE]\n\n",
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
        let held = b"data: {\"choices\":[{\"delta\":{\"content\":\"\"},\"token_ids\":[1]}]}\n\n";
        let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"\xc3\xa9\"},\"token_ids\":[2]}]}\n\n";
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
        let chunk = |i: u32| {
            format!("data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}},\"token_ids\":[3]}}]}}\n\n")
        };
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

    /// `n` choices interleaved, each event of `k` tokens (content only), one event every 40 ms
    /// per choice; then the usage chunk with the total.
    fn interleaved(obs: &mut StreamObserver, t0: Instant, events: &[(u32, u64)], total: Option<u64>) {
        for (step, (choice, ms)) in events.iter().enumerate() {
            let chunk =
                format!("data: {{\"choices\":[{{\"index\":{choice},\"delta\":{{\"content\":\"abcd{step}\"}}}}]}}\n\n");
            obs.feed(chunk.as_bytes(), t0 + Duration::from_millis(*ms), |_| {});
        }
        if let Some(total) = total {
            let usage = format!("data: {{\"choices\":[],\"usage\":{{\"completion_tokens\":{total}}}}}\n\n");
            obs.feed(usage.as_bytes(), t0 + Duration::from_secs(1), |_| {});
        }
    }

    #[tokio::test(start_paused = true)]
    async fn n_choices_split_the_usage_total_by_their_events() {
        // Two choices, six events of four tokens each: 24 tokens a choice, 48 in all.
        let t0 = Instant::now();
        let mut obs = observer();
        let events: Vec<(u32, u64)> = (0..6).flat_map(|i| [(0, 100 + 40 * i), (1, 110 + 40 * i)]).collect();
        interleaved(&mut obs, t0, &events, Some(48));
        let s = obs.summary();
        assert_eq!(s.output_tokens, Some(48));
        let exact = Duration::from_millis(200).div_f64(23.0);
        assert_eq!(s.tpot_per_choice, [exact, exact], "200 ms over 23 steps, not over 5");
    }

    #[test]
    fn the_total_is_split_by_largest_remainder_and_stated_counts_are_kept() {
        let choice = |events: u64, unstated: u64, stated: u64| ChoiceFacts {
            events,
            unstated_events: unstated,
            stated,
            ..ChoiceFacts::default()
        };
        let (a, b, c) = (choice(3, 3, 0), choice(6, 6, 0), choice(2, 0, 5));
        assert_eq!(split_total(34, &[&a, &b]), [Some(11), Some(23)]);
        assert_eq!(split_total(35, &[&a, &b, &c]), [Some(10), Some(20), Some(5)]);
        assert_eq!(split_total(5, &[&c]), [Some(5)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokenizer_counts_what_the_stream_does_not_state() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
        let counting = Counting {
            empty_finish_is_no_token: false,
            tokenizer: Some(Arc::new(TokenCounter::load(&dir).unwrap())),
        };
        let t0 = Instant::now();
        let mut obs = observer().with_counting(counting);
        for i in 0..5u64 {
            let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\" tok en tok en\"}}]}\n\n";
            obs.feed(chunk, t0 + Duration::from_millis(50 * i), |_| {});
        }
        let s = obs.summary();
        assert_eq!(s.count_source, Some(CountSource::Tokenizer));
        assert_eq!(s.output_tokens, Some(20));
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(200).div_f64(19.0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn llamacpps_empty_final_event_is_no_token() {
        let t0 = Instant::now();
        let stream = |obs: &mut StreamObserver| {
            for i in 0..3u64 {
                let chunk = b"data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n";
                obs.feed(chunk, t0 + Duration::from_millis(30 * i), |_| {});
            }
            let last = b"data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n";
            obs.feed(last, t0 + Duration::from_millis(90), |_| {});
            let usage = b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n";
            obs.feed(usage, t0 + Duration::from_millis(91), |_| {});
        };
        let llamacpp = Counting {
            empty_finish_is_no_token: true,
            tokenizer: None,
        };
        let mut obs = observer().with_counting(llamacpp);
        stream(&mut obs);
        let s = obs.summary();
        assert_eq!(s.token_events, 3);
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(30)]);
        // vLLM's empty final event is its last token, its text held back.
        let mut vllm = observer();
        stream(&mut vllm);
        assert_eq!(vllm.summary().token_events, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_start_sent_before_prefill_does_not_start_the_decode_clock() {
        // Anthropic's own API sends `message_start` at once; the first token comes 500 ms later.
        let t0 = Instant::now();
        let mut obs = StreamObserver::new(Protocol::Messages, 1 << 20, false);
        let at = |ms| t0 + Duration::from_millis(ms);
        obs.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9}}}\n\n", at(0), |_| {});
        for i in 0..5 {
            let delta = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n";
            obs.feed(delta, at(500 + 10 * i), |_| {});
        }
        let end = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        obs.feed(end, at(540), |_| {});
        let s = obs.summary();
        assert_eq!(s.first_token, Some(at(500)));
        assert_eq!(s.input_tokens, Some(9));
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(10)], "prefill is not decode");
        assert!(s.saw_done);
    }

    /// A Responses stream of `deltas` (text, ms) closed at `end` ms, `tokens` in all.
    fn responses(deltas: &[(&str, u64)], end: u64, tokens: u64) -> (StreamSummary, Instant) {
        let t0 = Instant::now();
        let mut obs = StreamObserver::new(Protocol::Responses, 1 << 20, false);
        let at = |ms| t0 + Duration::from_millis(ms);
        for (text, ms) in deltas {
            let delta = format!("event: response.output_text.delta\ndata: {{\"delta\":\"{text}\"}}\n\n");
            obs.feed(delta.as_bytes(), at(*ms), |_| {});
        }
        let completed = format!(
            "event: response.completed\ndata: {{\"response\":{{\"status\":\"completed\",\"usage\":{{\"output_tokens\":{tokens}}}}}}}\n\n"
        );
        obs.feed(completed.as_bytes(), at(end), |_| {});
        (obs.summary(), t0)
    }

    #[tokio::test(start_paused = true)]
    async fn the_gap_pattern_says_where_the_held_back_tokens_went() {
        // 10 tokens in 6 deltas, 20 ms a step: 4 held back. The third delta came two steps
        // after the second (one held-back token, here the rest of a character beyond ASCII);
        // the rest of the gaps are single steps, so the first delta carried the other three.
        let (s, t0) = responses(
            &[
                ("\\u00e4bcd", 100),
                ("ef", 120),
                ("é f", 160),
                ("ef", 180),
                ("ef", 200),
                ("ef", 220),
            ],
            221,
            10,
        );
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(20)]);
        assert_eq!(s.first_answer_token, Some(t0 + Duration::from_millis(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn with_too_few_gaps_for_a_pattern_the_first_delta_takes_its_share_by_characters() {
        // 7 tokens in 3 deltas: 4 held back. The first delta holds 4 of the 8 characters:
        // 1 + round(4 x 4 / 8) = 3 tokens in the first delta, 40 ms over 7 - 3 steps.
        let (s, _) = responses(&[("abcd", 100), ("ef", 120), ("ef", 140)], 140, 7);
        assert_eq!(s.tpot_per_choice, [Duration::from_millis(10)]);
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
        assert_eq!(strip.boundary(), stream.len() as u64);
    }
}
