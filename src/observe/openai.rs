//! Interpretation of OpenAI-compatible stream events (chat and completions), and of the
//! JSON bodies of every OpenAI-shaped route (embeddings, pooling, scoring, reranking,
//! transcription).
//!
//! Each SSE `data:` payload (or a whole non-streaming JSON body) is summarised without
//! allocating (sonic-rs's SIMD JSON reader under the same serde visitors): which choices
//! carried tokens, whether any of them is visible content and whether it is the answer, the
//! token counts the event states, its usage and whether it is an error (and whose fault) or
//! the `[DONE]` sentinel.

use super::event::{fault_of, with_odd_numbers_quoted, EventSummary, Usage, WireEngineMetrics};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// Summarises one `data:` payload of an OpenAI-compatible stream.
pub fn summarise(data: &[u8]) -> EventSummary {
    if data == b"[DONE]" {
        return EventSummary {
            done: true,
            ..EventSummary::default()
        };
    }
    // Only an object is a chunk (a derived struct would also accept an array of its fields).
    let parsed = match data.trim_ascii_start().first() {
        // A number JSON cannot carry (Python's NaN) costs only its own field.
        Some(b'{') => sonic_rs::from_slice::<Chunk>(data)
            .ok()
            .or_else(|| sonic_rs::from_slice(&with_odd_numbers_quoted(data)?).ok()),
        _ => None,
    };
    match parsed {
        Some(chunk) => {
            let choices = chunk.choices.unwrap_or_default();
            EventSummary {
                has_tokens: choices.token_choices > 0,
                visible: choices.visible,
                answer: choices.answer,
                choice: choices.first_token_choice.unwrap_or(0),
                explicit_tokens: choices.explicit_tokens,
                usage_only: chunk.usage.is_some() && choices.count == 0,
                usage: chunk.usage.map(WireUsage::usage),
                engine: chunk.metrics.and_then(WireEngineMetrics::timing),
                error: chunk.error.as_ref().map(fault_of),
                finish_only: choices.token_choices > 0 && choices.finish_only == choices.token_choices,
                ..EventSummary::default()
            }
        }
        None => EventSummary::default(),
    }
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<ChoicesSummary>,
    #[serde(default)]
    usage: Option<WireUsage>,
    /// vLLM's per-request metrics (`--enable-per-request-metrics`), beside the usage.
    #[serde(default)]
    metrics: Option<WireEngineMetrics>,
    /// Read in full (a rare event) to tell the client's fault from the engine's.
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// A `usage` object under any of the names OpenAI-shaped routes use.
#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    /// Transcription's usage.
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    /// Rerank states only a total, all of it input.
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn usage(self) -> Usage {
        let output_tokens = self.completion_tokens.or(self.output_tokens);
        let stated_input = self.prompt_tokens.or(self.input_tokens);
        Usage {
            input_tokens: stated_input.or(self.total_tokens.filter(|_| output_tokens.is_none())),
            output_tokens,
            reasoning_tokens: self.completion_tokens_details.and_then(|d| d.reasoning_tokens),
        }
    }
}

/// Present when a JSON value is not `null`.
struct NotNull;

impl<'de> Deserialize<'de> for NotNull {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| NotNull)
    }
}

/// The `choices` array folded into counts, without collecting it.
#[derive(Default)]
struct ChoicesSummary {
    count: usize,
    token_choices: usize,
    first_token_choice: Option<u32>,
    visible: bool,
    answer: bool,
    explicit_tokens: Option<u64>,
    /// Token-carrying choices with empty text and a finish reason.
    finish_only: usize,
}

impl<'de> Deserialize<'de> for ChoicesSummary {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct SeqVisitor;
        impl<'de> Visitor<'de> for SeqVisitor {
            type Value = ChoicesSummary;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ChoicesSummary, A::Error> {
                let mut summary = ChoicesSummary::default();
                while let Some(choice) = seq.next_element::<Choice>()? {
                    summary.count += 1;
                    let delta = choice.delta.unwrap_or_default();
                    let text = choice.text.or(delta.content);
                    let visible = text == Some(Text::NonEmpty)
                        || delta.reasoning == Some(Text::NonEmpty)
                        || delta.tool_calls.is_some();
                    // A choice carries a token when it has content text, even empty text that
                    // holds back a partial UTF-8 sequence; vLLM's role chunk has `role` and
                    // empty content and is not a token.
                    let held_back = text == Some(Text::Empty) && !delta.has_role;
                    if visible || held_back {
                        summary.token_choices += 1;
                        summary.first_token_choice.get_or_insert(choice.index);
                    }
                    if held_back && choice.finish_reason.is_some() {
                        summary.finish_only += 1;
                    }
                    summary.visible |= visible;
                    summary.answer |= text == Some(Text::NonEmpty);
                    if let Some(n) = choice.token_ids.or(choice.logprobs.and_then(|l| l.content)) {
                        *summary.explicit_tokens.get_or_insert(0) += n.0;
                    }
                }
                Ok(summary)
            }
            fn visit_unit<E: de::Error>(self) -> Result<ChoicesSummary, E> {
                Ok(ChoicesSummary::default())
            }
        }
        d.deserialize_any(SeqVisitor)
    }
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u32,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    text: Option<Text>,
    #[serde(default)]
    token_ids: Option<ArrayLen>,
    #[serde(default)]
    logprobs: Option<Logprobs>,
    #[serde(default)]
    finish_reason: Option<NotNull>,
}

#[derive(Deserialize)]
struct Logprobs {
    #[serde(default)]
    content: Option<ArrayLen>,
}

#[derive(Default)]
struct Delta {
    has_role: bool,
    content: Option<Text>,
    reasoning: Option<Text>,
    tool_calls: Option<ArrayLen>,
}

impl<'de> Deserialize<'de> for Delta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> Visitor<'de> for MapVisitor {
            type Value = Delta;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a delta object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Delta, A::Error> {
                let mut delta = Delta::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Role => delta.has_role = map.next_value::<Option<NotNull>>()?.is_some(),
                        Key::Content => delta.content = map.next_value()?,
                        Key::Reasoning => {
                            let text: Option<Text> = map.next_value()?;
                            if text == Some(Text::NonEmpty) || delta.reasoning.is_none() {
                                delta.reasoning = text;
                            }
                        }
                        Key::ToolCalls => delta.tool_calls = map.next_value::<Option<ArrayLen>>()?.filter(|n| n.0 > 0),
                        Key::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(delta)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Delta, E> {
                Ok(Delta::default())
            }
        }
        d.deserialize_any(MapVisitor)
    }
}

/// Keys of a delta that matter; everything else is skipped.
enum Key {
    Role,
    Content,
    Reasoning,
    ToolCalls,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                Ok(match key {
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "reasoning_content" | "reasoning" => Key::Reasoning,
                    "tool_calls" => Key::ToolCalls,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

/// Whether a JSON string is empty, learned without keeping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Text {
    Empty,
    NonEmpty,
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl Visitor<'_> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text, E> {
                Ok(if s.is_empty() { Text::Empty } else { Text::NonEmpty })
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

/// The length of a JSON array, counted without keeping its elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ArrayLen(u64);

impl<'de> Deserialize<'de> for ArrayLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct LenVisitor;
        impl<'de> Visitor<'de> for LenVisitor {
            type Value = ArrayLen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ArrayLen, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(ArrayLen(n))
            }
        }
        d.deserialize_seq(LenVisitor)
    }
}

/// Calls `on_text` with each choice's generated text in one event (content, reasoning,
/// completions text and tool-call arguments), for counting with a tokenizer. It allocates,
/// so it runs only where a tokenizer is configured and the stream states no counts.
pub fn generated_text(data: &[u8], mut on_text: impl FnMut(u32, &str)) {
    #[derive(Deserialize)]
    struct TextChunk {
        #[serde(default)]
        choices: Option<Vec<TextChoice>>,
    }
    #[derive(Deserialize)]
    struct TextChoice {
        #[serde(default)]
        index: u32,
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        delta: Option<TextDelta>,
    }
    #[derive(Deserialize)]
    struct TextDelta {
        #[serde(default)]
        content: Option<String>,
        #[serde(default, alias = "reasoning")]
        reasoning_content: Option<String>,
        #[serde(default)]
        tool_calls: Option<Vec<ToolCall>>,
    }
    #[derive(Deserialize)]
    struct ToolCall {
        #[serde(default)]
        function: Option<Function>,
    }
    #[derive(Deserialize)]
    struct Function {
        #[serde(default)]
        arguments: Option<String>,
    }
    let Ok(chunk) = serde_json::from_slice::<TextChunk>(data) else {
        return;
    };
    for choice in chunk.choices.unwrap_or_default() {
        let delta = choice.delta;
        let (content, reasoning, tools) = match delta {
            Some(d) => (d.content, d.reasoning_content, d.tool_calls.unwrap_or_default()),
            None => (None, None, Vec::new()),
        };
        for text in [choice.text, content, reasoning].into_iter().flatten() {
            on_text(choice.index, &text);
        }
        for arguments in tools.into_iter().filter_map(|t| t.function?.arguments) {
            on_text(choice.index, &arguments);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Fault;

    #[test]
    fn role_only_chunk_is_not_a_token() {
        let s =
            summarise(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#);
        assert!(!s.has_tokens && !s.visible);
    }

    #[test]
    fn content_chunk_is_a_visible_token() {
        let s = summarise(br#"{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null}]}"#);
        assert!(s.has_tokens && s.visible);
        assert_eq!(s.explicit_tokens, None);
    }

    #[test]
    fn empty_content_without_role_is_a_held_back_token() {
        let s = summarise(br#"{"choices":[{"index":0,"delta":{"content":""},"token_ids":null}]}"#);
        assert!(s.has_tokens && !s.visible);
    }

    #[test]
    fn finish_only_delta_is_not_a_token() {
        let s = summarise(br#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#);
        assert!(!s.has_tokens);
    }

    #[test]
    fn escaped_content_is_visible() {
        let s = summarise(br#"{"choices":[{"delta":{"content":"\n\u00e9"}}]}"#);
        assert!(s.visible);
    }

    #[test]
    fn reasoning_and_tool_calls_are_content_but_not_the_answer() {
        for event in [
            &br#"{"choices":[{"delta":{"reasoning_content":"hmm","content":null}}]}"#[..],
            br#"{"choices":[{"delta":{"reasoning":"hmm"}}]}"#,
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#,
        ] {
            let s = summarise(event);
            assert!(s.visible && !s.answer, "{}", String::from_utf8_lossy(event));
        }
        let s = summarise(br#"{"choices":[{"delta":{"reasoning_content":"","content":"Yes"}}]}"#);
        assert!(s.visible && s.answer);
        assert!(summarise(br#"{"choices":[{"index":0,"text":" a"}]}"#).answer);
    }

    #[test]
    fn completions_text_counts() {
        assert!(summarise(br#"{"object":"text_completion","choices":[{"index":0,"text":" a"}]}"#).visible);
        let held = summarise(br#"{"object":"text_completion","choices":[{"index":0,"text":""}]}"#);
        assert!(held.has_tokens && !held.visible);
    }

    #[test]
    fn explicit_token_counts_from_token_ids_or_logprobs() {
        let s = summarise(br#"{"choices":[{"delta":{"content":"abc"},"token_ids":[1,2,3]}]}"#);
        assert_eq!(s.explicit_tokens, Some(3));
        let s = summarise(
            br#"{"choices":[{"delta":{"content":"ab"},"logprobs":{"content":[{"token":"a"},{"token":"b"}]}}]}"#,
        );
        assert_eq!(s.explicit_tokens, Some(2));
    }

    #[test]
    fn the_token_carrying_choice_is_named() {
        let s = summarise(br#"{"choices":[{"index":3,"delta":{"content":"x"}}]}"#);
        assert_eq!(s.choice, 3);
        let s =
            summarise(br#"{"choices":[{"index":0,"delta":{"role":"assistant"}},{"index":1,"delta":{"content":"y"}}]}"#);
        assert_eq!(s.choice, 1);
    }

    #[test]
    fn llamacpp_and_tgi_chat_shapes() {
        // llama.cpp and SGLang: a role chunk without content, spaced separators.
        let role = summarise(
            br#"{"choices": [{"finish_reason": null, "index": 0, "delta": {"role": "assistant", "content": null}}]}"#,
        );
        assert!(!role.has_tokens);
        // TGI's OpenAI route: every delta carries the role and the content.
        let tgi =
            summarise(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null}]}"#);
        assert!(tgi.has_tokens && tgi.visible);
    }

    #[test]
    fn an_empty_final_event_is_marked_finish_only() {
        let last = summarise(br#"{"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}"#);
        assert!(last.has_tokens && last.finish_only);
        let held = summarise(br#"{"choices":[{"index":0,"text":"","finish_reason":null}]}"#);
        assert!(held.has_tokens && !held.finish_only);
        let with_text = summarise(br#"{"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}"#);
        assert!(with_text.has_tokens && !with_text.finish_only);
    }

    #[test]
    fn generated_text_of_every_kind_per_choice() {
        let mut seen = Vec::new();
        generated_text(
            br#"{"choices":[{"index":1,"delta":{"content":"Hi","reasoning_content":"hm","tool_calls":[{"function":{"arguments":"{}"}}]}},{"index":0,"text":" there"}]}"#,
            |i, t| seen.push((i, t.to_string())),
        );
        assert_eq!(
            seen,
            [
                (1, "Hi".into()),
                (1, "hm".into()),
                (1, "{}".into()),
                (0, " there".into())
            ]
        );
        generated_text(b"[DONE]", |_, _| panic!("no text"));
        generated_text(br#"{"choices":null}"#, |_, _| panic!("no text"));
    }

    #[test]
    fn usage_only_chunk() {
        let s = summarise(br#"{"choices":[],"usage":{"prompt_tokens":11,"total_tokens":27,"completion_tokens":16}}"#);
        assert!(s.usage_only && !s.has_tokens);
        assert_eq!(
            s.usage,
            Some(Usage {
                input_tokens: Some(11),
                output_tokens: Some(16),
                reasoning_tokens: None,
            })
        );
        let reasoning = summarise(
            br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":5}}}"#,
        );
        assert_eq!(reasoning.usage.unwrap().reasoning_tokens, Some(5));
    }

    #[test]
    fn the_usage_of_every_openai_shaped_route() {
        let input = |body: &[u8]| summarise(body).usage.and_then(|u| u.input_tokens);
        assert_eq!(
            input(br#"{"object":"list","data":[{"embedding":[0.1]}],"usage":{"prompt_tokens":8,"total_tokens":8}}"#),
            Some(8)
        );
        assert_eq!(
            input(br#"{"id":"rerank-1","results":[],"usage":{"total_tokens":12}}"#),
            Some(12)
        );
        let transcription =
            summarise(br#"{"text":"hi","usage":{"type":"tokens","input_tokens":30,"output_tokens":2}}"#)
                .usage
                .unwrap();
        assert_eq!(
            (transcription.input_tokens, transcription.output_tokens),
            (Some(30), Some(2))
        );
        let chat = summarise(br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#);
        assert_eq!(
            chat.usage.unwrap().input_tokens,
            Some(3),
            "a total is input only without output"
        );
    }

    #[test]
    fn error_payload_and_done() {
        assert_eq!(
            summarise(br#"{"error":{"message":"boom","code":500}}"#).error,
            Some(Fault::Engine)
        );
        let invalid = br#"{"error": {"message": "Requested sample logprobs of 50", "type": "BadRequestError", "param": "logprobs", "code": 400}}"#;
        assert_eq!(summarise(invalid).error, Some(Fault::Client));
        assert!(summarise(b"[DONE]").done);
        assert_eq!(summarise(br#"{"error":null,"choices":[]}"#).error, None);
    }

    #[test]
    fn garbage_is_unparsable_not_a_panic() {
        for junk in [&b"{"[..], b"", b"nul", b"{\"choices\":7}", b"\xff\xfe", b"[1,2]"] {
            let s = summarise(junk);
            assert_eq!(s, EventSummary::default(), "{junk:?}: nothing to learn from it");
        }
    }
}
