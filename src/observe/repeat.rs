//! Summaries of stream events that repeat an earlier event's shape, for every protocol.
//!
//! An engine writes every delta of a stream with the same bytes around a different piece of
//! text: vLLM's chat chunks share the id, `created`, the model and every field but `content`;
//! its Messages deltas differ only in `text`. Once one such event has been parsed, the next
//! one of the same `event:` type whose bytes equal it everywhere outside that string's text is
//! the same JSON document with another string in one place, and its summary depends on that
//! string only through its emptiness and its length in characters. So it gets the stored
//! summary after a byte comparison, with no JSON parse. Everything else, and any text that is
//! not a plain JSON string interior, goes to the protocol's interpreter. (The Responses API
//! numbers every event, so its deltas never repeat: they always go to the interpreter.)

use super::event::EventSummary;
use super::prefetch::prefetch;
use super::{messages, openai, responses, tgi};
use crate::record::Protocol;
use sonic_rs::{pointer, JsonPointer};

/// After this many events in a row miss the template, the next visible event replaces it.
const REBUILD_AFTER: u32 = 16;

/// Summarises one stream's events, reusing the summary of a repeated shape.
#[derive(Debug)]
pub struct RepeatSummariser {
    protocol: Protocol,
    template: Option<Template>,
    /// Events in a row that the template did not match.
    misses: u32,
    /// Events summarised from the template.
    #[cfg(test)]
    reused: u64,
}

impl RepeatSummariser {
    /// A summariser of `protocol`'s events.
    pub fn new(protocol: Protocol) -> Self {
        Self {
            protocol,
            template: None,
            misses: 0,
            #[cfg(test)]
            reused: 0,
        }
    }

    /// The summary the protocol's interpreter gives for the event `event_type` with `data`.
    pub fn summarise(&mut self, event_type: &[u8], data: &[u8]) -> EventSummary {
        let protocol = self.protocol;
        if let Some(summary) = self
            .template
            .as_mut()
            .and_then(|t| t.summary_of(protocol, event_type, data))
        {
            self.misses = 0;
            #[cfg(test)]
            {
                self.reused += 1;
            }
            return summary;
        }
        let summary = interpret(self.protocol, event_type, data);
        self.misses = self.misses.saturating_add(1);
        if summary.visible && (self.template.is_none() || self.misses >= REBUILD_AFTER) {
            if let Some(template) = Template::of(self.protocol, event_type, data, summary) {
                self.template = Some(template);
                self.misses = 0;
            }
        }
        summary
    }

    /// Asks for the template's bytes, which the next event is compared with.
    pub fn prefetch(&self) {
        if let Some(template) = &self.template {
            prefetch(&*template.bytes);
        }
    }
}

/// The full summary of an event by its protocol's interpreter.
fn interpret(protocol: Protocol, event_type: &[u8], data: &[u8]) -> EventSummary {
    match protocol {
        Protocol::OpenAi => openai::summarise(data),
        Protocol::Responses => responses::summarise(event_type, data),
        Protocol::Messages => messages::summarise(event_type, data),
        Protocol::Tgi => tgi::summarise(data),
    }
}

/// One event's type and bytes around a string's text, with the summaries for non-empty and
/// empty text.
#[derive(Debug)]
struct Template {
    /// The event type, then everything up to and including the string's opening quote, then
    /// everything from its closing quote: one allocation, so that a comparison reads one run of
    /// memory (at a thousand streams, each stream's template is out of the cache when its next
    /// event comes).
    bytes: Box<[u8]>,
    /// Where the prefix and the suffix start in `bytes`.
    prefix_at: usize,
    suffix_at: usize,
    /// The summary with one character of text.
    filled: EventSummary,
    /// The summary with empty text, once an event has shown it (many streams never do); boxed,
    /// as a summary takes 160 bytes.
    empty: Option<Box<EventSummary>>,
}

impl Template {
    /// The template of the event `event_type` with `data` around the first generated text it
    /// holds as a string; `summary` is the interpreter's summary of that event.
    fn of(protocol: Protocol, event_type: &[u8], data: &[u8], summary: EventSummary) -> Option<Template> {
        // Where the protocol's events hold their generated text; the Responses API numbers its
        // events and TGI's differ in their token ids, so theirs never repeat: no template.
        let first_span = |paths: &[&JsonPointer]| paths.iter().find_map(|path| string_span(data, path));
        let (start, end) = match protocol {
            Protocol::OpenAi => first_span(&[
                &pointer!["choices", 0, "delta", "content"],
                &pointer!["choices", 0, "text"],
                &pointer!["choices", 0, "delta", "reasoning_content"],
                &pointer!["choices", 0, "delta", "reasoning"],
            ]),
            Protocol::Messages => first_span(&[
                &pointer!["delta", "text"],
                &pointer!["delta", "thinking"],
                &pointer!["delta", "partial_json"],
            ]),
            Protocol::Responses | Protocol::Tgi => None,
        }?;
        let (prefix, suffix) = (&data[..=start], &data[end - 1..]);
        // The event's own summary is the filled one, its character count aside, when its text
        // is plain and not empty; otherwise the interpreter is asked for one character.
        let filled = match plain_string_chars(&data[start + 1..end - 1]) {
            Some(chars) if chars > 0 => EventSummary {
                text_chars: if summary.text_chars as usize == chars {
                    1
                } else {
                    summary.text_chars
                },
                ..summary
            },
            _ => interpret(protocol, event_type, &[prefix, b"x", suffix].concat()),
        };
        Some(Template {
            bytes: [event_type, prefix, suffix].concat().into(),
            prefix_at: event_type.len(),
            suffix_at: event_type.len() + prefix.len(),
            filled,
            empty: None,
        })
    }

    /// The summary of the event `event_type` with `data`, if it is this template with other
    /// plain text in the string. The first with empty text is the template's empty event
    /// itself: its interpreter's summary is kept for the next.
    fn summary_of(&mut self, protocol: Protocol, event_type: &[u8], data: &[u8]) -> Option<EventSummary> {
        let (own_type, rest) = self.bytes.split_at(self.prefix_at);
        let (prefix, suffix) = rest.split_at(self.suffix_at - self.prefix_at);
        let text_end = data.len().checked_sub(suffix.len())?;
        let text = data.get(prefix.len()..text_end)?;
        if own_type != event_type || !data.starts_with(prefix) || !data.ends_with(suffix) {
            return None;
        }
        let chars = plain_string_chars(text)?;
        Some(match (chars, self.filled.text_chars) {
            (0, _) => **self
                .empty
                .get_or_insert_with(|| Box::new(interpret(protocol, event_type, data))),
            // The protocol counts the text's characters: the stored one-character text's
            // summary with this text's count.
            (n, 1) => EventSummary {
                text_chars: u32::try_from(n).unwrap_or(u32::MAX),
                ..self.filled
            },
            _ => self.filled,
        })
    }
}

/// The byte span, quotes included, of the string value at `path` in `data`.
fn string_span(data: &[u8], path: &JsonPointer) -> Option<(usize, usize)> {
    let value = sonic_rs::get_from_slice(data, path).ok()?;
    let raw = value.as_raw_str().as_bytes();
    let start = (raw.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    let end = start + raw.len();
    let quoted = raw.len() >= 2 && raw[0] == b'"' && raw[raw.len() - 1] == b'"';
    (quoted && end <= data.len()).then_some((start, end))
}

/// The decoded length in characters of `text`, if it is a plain inside of a JSON string:
/// valid UTF-8, no quote or control character, and only one-character escapes (a `\u`
/// escape could be a lone surrogate, which a JSON reader may refuse).
fn plain_string_chars(text: &[u8]) -> Option<usize> {
    // Most deltas are a few ASCII letters and spaces: one pass over the bytes tells.
    if text
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        return Some(text.len());
    }
    let mut bytes = text.iter();
    let mut escapes = 0;
    while let Some(&b) = bytes.next() {
        let plain = match b {
            b'"' | 0..=0x1f => false,
            b'\\' => {
                escapes += 1;
                matches!(
                    bytes.next(),
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't')
                )
            }
            _ => true,
        };
        if !plain {
            return None;
        }
    }
    let text = std::str::from_utf8(text).ok()?;
    Some(text.chars().count() - escapes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENT: &str = r#"{"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"KEY":"TEXT"},"logprobs":null,"finish_reason":null}]}"#;

    fn event(key: &str, text: &str) -> Vec<u8> {
        EVENT.replace("KEY", key).replace("TEXT", text).into_bytes()
    }

    fn delta(text: &str) -> Vec<u8> {
        event("content", text)
    }

    /// Every event through one summariser, checked against a full parse of each.
    fn agrees_with_full_parse(events: &[Vec<u8>]) -> u64 {
        let mut repeat = RepeatSummariser::new(Protocol::OpenAi);
        for event in events {
            assert_eq!(
                repeat.summarise(b"", event),
                openai::summarise(event),
                "{}",
                String::from_utf8_lossy(event)
            );
        }
        repeat.reused
    }

    /// Every typed event (`event:` and `data:`) of a capture through one summariser, checked
    /// against the protocol's interpreter; returns how many were reused.
    fn typed_agrees_with_full_parse(protocol: Protocol, capture: &[u8]) -> u64 {
        let mut repeat = RepeatSummariser::new(protocol);
        let mut parser = super::super::sse::SseParser::new(1 << 20);
        parser.feed(capture, |e| {
            assert_eq!(
                repeat.summarise(e.event_type, e.data),
                interpret(protocol, e.event_type, e.data),
                "{}",
                String::from_utf8_lossy(e.data)
            );
        });
        repeat.reused
    }

    #[test]
    fn messages_and_responses_captures_summarise_as_their_interpreter_does() {
        let mut reused = 0;
        for (name, protocol) in [
            ("messages-stream", Protocol::Messages),
            ("messages-sampled-1", Protocol::Messages),
            ("messages-near-limit", Protocol::Messages),
            ("messages-per-request-metrics", Protocol::Messages),
            ("responses-stream", Protocol::Responses),
            ("responses-sampled-1", Protocol::Responses),
        ] {
            let path = format!("{}/tests/fixtures/apis/{name}.sse", env!("CARGO_MANIFEST_DIR"));
            let reused_here = typed_agrees_with_full_parse(protocol, &std::fs::read(path).unwrap());
            if protocol == Protocol::Responses {
                assert_eq!(reused_here, 0, "{name}: numbered events never repeat");
            }
            reused += reused_here;
        }
        assert!(reused > 90, "the Messages deltas are reused: {reused}");
    }

    #[test]
    fn a_reused_messages_delta_counts_its_own_characters() {
        let delta = |text: &str| {
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#)
        };
        let mut repeat = RepeatSummariser::new(Protocol::Messages);
        for text in ["a", r"tab\there", "été", r#"q\"q"#, "", "b"] {
            let data = delta(text);
            let summary = repeat.summarise(b"content_block_delta", data.as_bytes());
            assert_eq!(
                summary,
                interpret(Protocol::Messages, b"content_block_delta", data.as_bytes()),
                "{text}"
            );
        }
        assert_eq!(repeat.reused, 5);
        let other_type = delta("x");
        let summary = repeat.summarise(b"error", other_type.as_bytes());
        assert_eq!(
            summary,
            interpret(Protocol::Messages, b"error", other_type.as_bytes()),
            "another event type"
        );
    }

    #[test]
    fn a_template_made_from_any_first_text_summarises_as_its_interpreter_does() {
        let messages = |text: &str| {
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{text}"}}}}"#)
        };
        let chat = |text: &str| String::from_utf8(delta(text)).unwrap();
        // The first text makes the template: several characters, non-ASCII, escaped, or a
        // `\u` escape (not plain: the interpreter is asked for the one-character summary).
        for first in ["été", "many words", r"tab\there", r"\u00e9", "a"] {
            for (protocol, event_type, event) in [
                (
                    Protocol::Messages,
                    &b"content_block_delta"[..],
                    &messages as &dyn Fn(&str) -> String,
                ),
                (Protocol::OpenAi, &b""[..], &chat),
            ] {
                let mut repeat = RepeatSummariser::new(protocol);
                for text in [first, "b", "ünï", "", "", "two words", "é"] {
                    let data = event(text);
                    assert_eq!(
                        repeat.summarise(event_type, data.as_bytes()),
                        interpret(protocol, event_type, data.as_bytes()),
                        "{protocol:?}: {first} then {text}"
                    );
                }
                assert_eq!(repeat.reused, 6, "{protocol:?}: every event after {first}");
            }
        }
    }

    #[test]
    fn real_captures_summarise_as_a_full_parse_does() {
        let mut reused = 0;
        for name in [
            "vllm-chat.sse",
            "vllm-completions.sse",
            "vllm-chat-eos.sse",
            "vllm-chat-n2.sse",
            "vllm-chat-continuous-usage.sse",
            "vllm-chat-nousage.sse",
            "vllm-small-chat.sse",
        ] {
            let capture = std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            let events: Vec<Vec<u8>> = capture
                .split(|b| *b == b'\n')
                .filter_map(|line| line.strip_prefix(b"data: "))
                .map(<[u8]>::to_vec)
                .collect();
            reused += agrees_with_full_parse(&events);
        }
        assert!(reused > 200, "the repeated deltas are reused: {reused}");
    }

    #[test]
    fn text_that_is_not_plain_is_parsed_in_full() {
        let mut invalid_utf8 = delta("??");
        let at = invalid_utf8.windows(2).position(|w| w == b"??").unwrap();
        invalid_utf8[at..at + 2].copy_from_slice(b"\xff\xfe");
        let events = [
            delta("a"),
            delta(""),
            delta(r#"line\nbreak \"quoted\" back\\slash"#),
            delta(r"\ud800"),
            delta(r"\u00e9"),
            delta(r"trailing\"),
            delta(r#"x"},"finish_reason":"stop","y":{"z":""#),
            delta("tab\tinside"),
            invalid_utf8,
            delta("b"),
        ];
        let reused = agrees_with_full_parse(&events);
        assert_eq!(reused, 3, "the empty, escaped-plain and last deltas are reused");
    }

    #[test]
    fn plain_text_is_counted_in_characters_and_the_rest_is_refused() {
        for (text, chars) in [
            (&b""[..], Some(0)),
            (b" the words", Some(10)),
            (b"del\x7f", Some(4)),
            ("été".as_bytes(), Some(3)),
            (br#"say \"hi\"\n"#, Some(9)),
            (br#"a"b"#, None),
            (b"tab\tinside", None),
            (br"\u00e9", None),
            (br"trailing\", None),
            (b"\xff\xfe", None),
        ] {
            assert_eq!(plain_string_chars(text), chars, "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn other_shapes_miss_and_the_template_follows_the_stream() {
        let reasoning = |i: usize| event("reasoning_content", &format!("r{i}"));
        let mut events = vec![delta("a")];
        events.extend((0..20).map(reasoning));
        events.push(br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":21}}"#.to_vec());
        events.push(b"[DONE]".to_vec());
        let reused = agrees_with_full_parse(&events);
        assert_eq!(
            reused,
            20 - u64::from(REBUILD_AFTER),
            "rebuilt from reasoning after {REBUILD_AFTER} misses"
        );
    }
}
