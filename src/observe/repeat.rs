//! Summaries of OpenAI stream events that repeat an earlier event's shape.
//!
//! An engine writes every delta of a stream with the same bytes around a different piece of
//! text: vLLM's chunks share the id, `created`, the model and every field but `content`. Once
//! one such event has been parsed, the next one whose bytes equal it everywhere outside that
//! string's text is the same JSON document with another string in one place, and its summary
//! depends on that string only through whether it is empty (see [`openai::summarise`]). So it
//! gets the stored summary after a byte comparison, with no JSON parse. Everything else, and
//! any text that is not a plain JSON string interior, is parsed in full.

use super::event::EventSummary;
use super::openai;
use sonic_rs::{pointer, JsonPointer};

/// After this many events in a row miss the template, the next visible event replaces it.
const REBUILD_AFTER: u32 = 16;

/// Summarises one stream's OpenAI events, reusing the summary of a repeated shape.
#[derive(Debug, Default)]
pub struct RepeatSummariser {
    template: Option<Template>,
    /// Events in a row that the template did not match.
    misses: u32,
    /// Events summarised from the template.
    #[cfg(test)]
    reused: u64,
}

impl RepeatSummariser {
    /// The summary [`openai::summarise`] gives for `data`.
    pub fn summarise(&mut self, data: &[u8]) -> EventSummary {
        if let Some(summary) = self.template.as_ref().and_then(|t| t.summary_of(data)) {
            self.misses = 0;
            #[cfg(test)]
            {
                self.reused += 1;
            }
            return summary;
        }
        let summary = openai::summarise(data);
        self.misses = self.misses.saturating_add(1);
        if summary.visible && (self.template.is_none() || self.misses >= REBUILD_AFTER) {
            if let Some(template) = Template::of(data) {
                self.template = Some(template);
                self.misses = 0;
            }
        }
        summary
    }
}

/// One event's bytes around a string's text, with the summaries for empty and non-empty text.
#[derive(Debug)]
struct Template {
    /// Everything up to and including the string's opening quote.
    prefix: Box<[u8]>,
    /// Everything from the string's closing quote.
    suffix: Box<[u8]>,
    empty: EventSummary,
    filled: EventSummary,
}

impl Template {
    /// The template of `data` around the first delta text it holds as a string.
    fn of(data: &[u8]) -> Option<Template> {
        let text_paths: [&JsonPointer; 4] = [
            &pointer!["choices", 0, "delta", "content"],
            &pointer!["choices", 0, "text"],
            &pointer!["choices", 0, "delta", "reasoning_content"],
            &pointer!["choices", 0, "delta", "reasoning"],
        ];
        let (start, end) = text_paths.into_iter().find_map(|path| string_span(data, path))?;
        let prefix: Box<[u8]> = data[..=start].into();
        let suffix: Box<[u8]> = data[end - 1..].into();
        let with_text = |text: &[u8]| openai::summarise(&[&prefix[..], text, &suffix[..]].concat());
        Some(Template {
            empty: with_text(b""),
            filled: with_text(b"x"),
            prefix,
            suffix,
        })
    }

    /// The summary of `data` if it is this template with other plain text in the string.
    fn summary_of(&self, data: &[u8]) -> Option<EventSummary> {
        let text_end = data.len().checked_sub(self.suffix.len())?;
        let text = data.get(self.prefix.len()..text_end)?;
        if !data.starts_with(&self.prefix) || !data.ends_with(&self.suffix) || !is_plain_string_interior(text) {
            return None;
        }
        Some(if text.is_empty() { self.empty } else { self.filled })
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

/// Whether `text` is the inside of a JSON string that decodes to text of the same emptiness:
/// valid UTF-8, no quote or control character, and only one-character escapes (a `\u`
/// escape could be a lone surrogate, which a JSON reader may refuse).
fn is_plain_string_interior(text: &[u8]) -> bool {
    let mut bytes = text.iter();
    while let Some(&b) = bytes.next() {
        let plain = match b {
            b'"' | 0..=0x1f => false,
            b'\\' => matches!(
                bytes.next(),
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't')
            ),
            _ => true,
        };
        if !plain {
            return false;
        }
    }
    std::str::from_utf8(text).is_ok()
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
        let mut repeat = RepeatSummariser::default();
        for event in events {
            assert_eq!(
                repeat.summarise(event),
                openai::summarise(event),
                "{}",
                String::from_utf8_lossy(event)
            );
        }
        repeat.reused
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
