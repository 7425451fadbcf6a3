//! The streaming observer: SSE parsing plus interpretation plus timestamps for one response.

use super::event::{EventSummary, Usage};
use super::prefetch::prefetch;
use super::repeat::RepeatSummariser;
use super::sse::SseParser;
use super::steps::DecodeSteps;
use super::tokens::TokenCounter;
use super::{messages, openai, responses};
use crate::record::Protocol;
use crate::record::{CountSource, EngineTiming, Fault, Outcome, RequestRecord, TpotBasis};
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
    /// The event that marks the first token (Messages' `message_start`) is sent with it, as
    /// vLLM does: the decode clock starts there however long the first text was held back.
    /// Otherwise the mark is trusted only when the held-back tokens can explain its lead.
    pub mark_is_first_token: bool,
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
    /// How the TPOT was known: the least sure of the choices' bases.
    pub tpot_basis: Option<TpotBasis>,
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
        record.tpot_basis = self.tpot_basis;
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

    /// Asks for what the next event reads outside the observer itself: the template's bytes
    /// and the choices' facts.
    pub fn prefetch(&self) {
        self.repeat.prefetch();
        prefetch(self.facts.choices.as_slice());
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
        let engine_tpot = facts.engine.and_then(|e| Duration::try_from_secs_f64(e.tpot?).ok());
        let tpots: Vec<(Duration, TpotBasis)> = active
            .iter()
            .zip(per_choice)
            .filter_map(|(c, n)| match self.protocol {
                Protocol::Responses | Protocol::Messages => {
                    let stream = self.delta_tpot(c, n?);
                    let held_back = n? > c.events && active.len() == 1;
                    if held_back {
                        engine_or_stream(engine_tpot, stream)
                    } else {
                        stream
                    }
                }
                Protocol::OpenAi | Protocol::Tgi => Some((tpot(c.first, c.last, n?)?, TpotBasis::Stream)),
            })
            .collect();
        StreamSummary {
            first_token: facts.first_token,
            first_token_event: facts.first_token_event,
            first_answer_token: facts.first_answer,
            tpot_per_choice: tpots.iter().map(|&(tpot, _)| tpot).collect(),
            tpot_basis: tpots.iter().map(|&(_, basis)| basis).max(),
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
    /// an event that marks it (vLLM's `message_start`), when the engine is known to send it
    /// with the first token or its lead over the first delta fits the held-back tokens. Else
    /// it starts at the first delta, over the steps after it:
    /// the tokenizer's count of the first delta's text says how many tokens it carried;
    /// without one, the gap pattern says how many steps each later gap spanned
    /// ([`DecodeSteps`]), the rest of the held-back tokens being the first delta's; with too
    /// few gaps for a pattern, the first delta takes its share by characters of text. The
    /// clock stops at the last token: the last delta, or the first event after it that
    /// closes the output, when the last tokens' text was held back to the end. The figure is
    /// an estimate ([`TpotBasis::Estimated`]) where tokens were held back and neither the mark
    /// nor the tokenizer says where they went.
    fn delta_tpot(&self, choice: &ChoiceFacts, n: u64) -> Option<(Duration, TpotBasis)> {
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
        let trusted = |mark: Instant| self.counting.mark_is_first_token || mark_fits(mark);
        let known = TpotBasis::Stream;
        if let Some(mark) = self.facts.first_token_mark.filter(|&mark| trusted(mark)) {
            return (n > 1 && last > mark).then(|| ((last - mark).div_f64((n - 1) as f64), known));
        }
        if let Some(carried) = self.first_delta_tokenized(choice) {
            return (n > carried && last > first).then(|| ((last - first).div_f64((n - carried) as f64), known));
        }
        let basis = if held_back > 0 { TpotBasis::Estimated } else { known };
        if let Some(steps) = choice.steps.count(last - last_delta) {
            let gaps = deltas - 1;
            let after_first = gaps + held_back.min(steps.between - gaps + steps.tail);
            let end = if steps.tail > 0 { last } else { last_delta };
            return (after_first > 0 && end > first).then(|| ((end - first).div_f64(after_first as f64), basis));
        }
        let carried = self.first_delta_share(choice, held_back);
        (n > carried && last > first).then(|| ((last - first).div_f64((n - carried) as f64), basis))
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

/// The TPOT of an answer whose held-back tokens may have left the stream's figure an
/// estimate: the engine's own, where the answer states one, is exact. It is untrusted input
/// too: a figure more than twice the stream's or under half of it (the stream's estimate errs
/// by a third at worst on real answers under load) is not the engine's account of this
/// answer, and the stream's stands.
fn engine_or_stream(engine: Option<Duration>, stream: Option<(Duration, TpotBasis)>) -> Option<(Duration, TpotBasis)> {
    match (engine, stream) {
        (Some(engine), Some((stream, _))) if engine <= stream * 2 && engine * 2 >= stream => {
            Some((engine, TpotBasis::Engine))
        }
        (Some(engine), None) => Some((engine, TpotBasis::Engine)),
        (_, stream) => stream,
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
            // Exactly as many as seen: most streams have one choice, and a growing Vec would
            // hold four.
            self.choices.reserve_exact(index + 1 - self.choices.len());
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
mod tests;
