//! Interpretation of Anthropic's Messages API (`POST /v1/messages`), streamed and not.
//!
//! A stream is `message_start` (input tokens; vLLM sends it with the first generated token),
//! then per content block `content_block_start`, `content_block_delta`s (`text_delta` is the
//! answer; `thinking_delta` and a tool call's `input_json_delta` are generated but not the
//! answer) and `content_block_stop`; then `message_delta` (stop reason and
//! `usage.output_tokens`) and `message_stop`. `ping` keeps the connection alive; `error`
//! events say what failed (`overloaded_error` is the engine's, `invalid_request_error` the
//! client's).

use super::event::{event_name, fault_of, fault_of_event, EventSummary, TextChars, TypedUsage};
use crate::record::Fault;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct MessageStart {
    #[serde(default)]
    message: Option<MessageObject>,
}

/// A message object: `message_start`'s `message`, or a non-streamed answer.
#[derive(Deserialize)]
struct MessageObject {
    #[serde(default)]
    usage: Option<TypedUsage>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct BlockDeltaEvent {
    #[serde(default)]
    delta: Option<BlockDelta>,
}

/// The generated text of a `content_block_delta`, by the field that holds it.
#[derive(Deserialize)]
struct BlockDelta {
    #[serde(default)]
    text: Option<TextChars>,
    #[serde(default)]
    thinking: Option<TextChars>,
    #[serde(default)]
    partial_json: Option<TextChars>,
}

#[derive(Deserialize)]
struct MessageDelta {
    #[serde(default)]
    usage: Option<TypedUsage>,
}

/// Summarises one Messages stream event of type `event_type` (its `event:` field; the data's
/// `type` when it has none).
pub fn summarise(event_type: &[u8], data: &[u8]) -> EventSummary {
    match &*event_name(event_type, data) {
        b"content_block_delta" => {
            let Some(delta) = sonic_rs::from_slice::<BlockDeltaEvent>(data).ok().and_then(|e| e.delta) else {
                return EventSummary::default();
            };
            let answer = delta.text.unwrap_or_default().0;
            let chars = answer + delta.thinking.unwrap_or_default().0 + delta.partial_json.unwrap_or_default().0;
            EventSummary {
                has_tokens: chars > 0,
                visible: chars > 0,
                answer: answer > 0,
                text_chars: chars,
                ..EventSummary::default()
            }
        }
        b"message_start" => EventSummary {
            first_token_mark: true,
            usage: sonic_rs::from_slice::<MessageStart>(data)
                .ok()
                .and_then(|e| e.message?.usage)
                .map(TypedUsage::usage),
            ..EventSummary::default()
        },
        b"content_block_stop" => EventSummary {
            generation_end: true,
            ..EventSummary::default()
        },
        b"message_delta" => EventSummary {
            generation_end: true,
            usage: sonic_rs::from_slice::<MessageDelta>(data)
                .ok()
                .and_then(|e| e.usage)
                .map(TypedUsage::usage),
            ..EventSummary::default()
        },
        b"message_stop" => EventSummary {
            done: true,
            ..EventSummary::default()
        },
        b"error" => EventSummary {
            error: Some(fault_of_event(data)),
            ..EventSummary::default()
        },
        _ => EventSummary::default(),
    }
}

/// Calls `on_text` with a `content_block_delta`'s generated text (answer, thinking or tool
/// input), for counting with a tokenizer (it allocates: only where a tokenizer is configured).
pub fn generated_text(data: &[u8], mut on_text: impl FnMut(&str)) {
    #[derive(Deserialize)]
    struct Event {
        delta: Option<Delta>,
    }
    #[derive(Deserialize)]
    struct Delta {
        text: Option<String>,
        thinking: Option<String>,
        partial_json: Option<String>,
    }
    let Ok(Event { delta: Some(delta) }) = serde_json::from_slice::<Event>(data) else {
        return;
    };
    for text in [delta.text, delta.thinking, delta.partial_json].into_iter().flatten() {
        on_text(&text);
    }
}

/// Summarises a whole non-streamed answer: its usage, or its error.
pub fn summarise_body(data: &[u8]) -> EventSummary {
    let Ok(message) = sonic_rs::from_slice::<MessageObject>(data) else {
        return EventSummary::default();
    };
    let error = match (&message.error, message.kind.as_deref()) {
        (Some(error), _) => Some(fault_of(error)),
        (None, Some("error")) => Some(Fault::Engine),
        (None, _) => None,
    };
    EventSummary {
        usage: message.usage.map(TypedUsage::usage),
        error,
        ..EventSummary::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_start_marks_the_first_token_and_states_the_input() {
        let s = summarise(
            b"message_start",
            br#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"small","stop_reason":null,"usage":{"input_tokens":41,"output_tokens":0}}}"#,
        );
        assert!(s.first_token_mark && !s.has_tokens);
        assert_eq!(s.usage.unwrap().input_tokens, Some(41));
    }

    #[test]
    fn text_is_the_answer_thinking_and_tool_input_are_not() {
        let text = summarise(
            b"content_block_delta",
            br#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"77"},"index":0}"#,
        );
        assert!(text.has_tokens && text.visible && text.answer);
        assert_eq!(text.text_chars, 2);
        for data in [
            &br#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#[..],
            br#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#,
        ] {
            let s = summarise(b"content_block_delta", data);
            assert!(s.visible && !s.answer, "{}", String::from_utf8_lossy(data));
        }
        let signature = summarise(
            b"content_block_delta",
            br#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#,
        );
        assert!(!signature.has_tokens);
    }

    #[test]
    fn the_end_of_a_message() {
        let stop = summarise(b"content_block_stop", br#"{"type":"content_block_stop","index":0}"#);
        assert!(stop.generation_end && !stop.done);
        let delta = summarise(
            b"message_delta",
            br#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"input_tokens":41,"output_tokens":32}}"#,
        );
        assert_eq!(delta.usage.unwrap().output_tokens, Some(32));
        assert!(summarise(b"message_stop", br#"{"type":"message_stop"}"#).done);
        assert_eq!(summarise(b"ping", br#"{"type": "ping"}"#), EventSummary::default());
        assert!(
            summarise(b"", br#"{"type":"message_stop"}"#).done,
            "the data's type will do"
        );
    }

    #[test]
    fn errors_say_whose_fault() {
        let overloaded = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(summarise(b"error", overloaded).error, Some(Fault::Engine));
        let invalid = br#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#;
        assert_eq!(summarise(b"error", invalid).error, Some(Fault::Client));
    }

    #[test]
    fn generated_text_of_a_delta() {
        let mut seen = Vec::new();
        generated_text(
            br#"{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"hm"},"index":0}"#,
            |t| seen.push(t.to_string()),
        );
        generated_text(br#"{"type":"message_stop"}"#, |t| seen.push(t.to_string()));
        assert_eq!(seen, ["hm"]);
    }

    #[test]
    fn whole_bodies() {
        let ok = summarise_body(
            br#"{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"7"}],"model":"small","stop_reason":"max_tokens","usage":{"input_tokens":41,"output_tokens":32}}"#,
        );
        let usage = ok.usage.unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (Some(41), Some(32)));
        assert!(ok.error.is_none());
        let overloaded = summarise_body(br#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#);
        assert_eq!(overloaded.error, Some(Fault::Engine));
    }
}
