//! Interpretation of OpenAI's Responses API (`POST /v1/responses`), streamed and not.
//!
//! A stream is typed events (`event: <type>` + `data: <json>`) with no `[DONE]`:
//! `response.created` and `response.in_progress` come before prefill and carry no token;
//! generated text arrives in `*.delta` events (`response.output_text.delta` and
//! `response.refusal.delta` are the answer; `response.reasoning_text.delta`,
//! `response.function_call_arguments.delta` and the other deltas are generated but not the
//! answer); each part closes with a `*.done`; the stream ends with `response.completed`
//! (status `completed`, or `incomplete` for a max-tokens cut: both a success),
//! `response.incomplete`, `response.failed` or an `error` event. Usage is only in the
//! terminal event's `response.usage`.

use super::event::{
    event_name, fault_of, fault_of_event, with_odd_numbers_quoted, EventSummary, TypedUsage, WireEngineMetrics,
};
use crate::record::Fault;
use serde::Deserialize;
use serde_json::Value;

/// What an event's type says about it.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// Generated text; `answer` for the answer itself.
    Delta { answer: bool },
    /// A part of the output is complete (`*.done`).
    PartDone,
    /// `response.completed` or `response.incomplete`: the end, with usage.
    Terminal,
    /// `response.failed`: the end, with the engine's error.
    Failed,
    /// An `error` event.
    Error,
    /// Lifecycle events that carry nothing to measure.
    Other,
}

fn kind(name: &[u8]) -> Kind {
    match name {
        b"response.output_text.delta" | b"response.refusal.delta" => Kind::Delta { answer: true },
        b"response.completed" | b"response.incomplete" => Kind::Terminal,
        b"response.failed" => Kind::Failed,
        b"error" => Kind::Error,
        _ if name.ends_with(b".delta") => Kind::Delta { answer: false },
        _ if name.ends_with(b".done") => Kind::PartDone,
        _ => Kind::Other,
    }
}

#[derive(Deserialize)]
struct TerminalEvent {
    #[serde(default)]
    response: Option<ResponseObject>,
}

/// A response object: the terminal event's `response`, or a non-streamed answer.
#[derive(Deserialize)]
struct ResponseObject {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    usage: Option<TypedUsage>,
    /// vLLM's per-request metrics (`--enable-per-request-metrics`).
    #[serde(default)]
    metrics: Option<WireEngineMetrics>,
    #[serde(default)]
    error: Option<Value>,
}

/// Summarises one Responses stream event of type `event_type` (its `event:` field; the
/// data's `type` when it has none).
pub fn summarise(event_type: &[u8], data: &[u8]) -> EventSummary {
    match kind(&event_name(event_type, data)) {
        Kind::Delta { answer } => {
            let chars = sonic_rs::get(data, ["delta"])
                .ok()
                .and_then(|delta| sonic_rs::JsonValueTrait::as_str(&delta).map(|s| s.chars().count()))
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
            let has_tokens = chars > 0;
            EventSummary {
                has_tokens,
                visible: has_tokens,
                answer: answer && has_tokens,
                text_chars: chars,
                ..EventSummary::default()
            }
        }
        Kind::PartDone => EventSummary {
            generation_end: true,
            ..EventSummary::default()
        },
        terminal @ (Kind::Terminal | Kind::Failed) => {
            let response = sonic_rs::from_slice::<TerminalEvent>(data)
                .ok()
                .or_else(|| sonic_rs::from_slice(&with_odd_numbers_quoted(data)?).ok())
                .and_then(|e| e.response);
            let summary = response.map(ResponseObject::summary).unwrap_or_default();
            let failed = (terminal == Kind::Failed).then_some(Fault::Engine);
            EventSummary {
                done: true,
                generation_end: true,
                error: summary.error.or(failed),
                ..summary
            }
        }
        Kind::Error => EventSummary {
            error: Some(fault_of_event(data)),
            ..EventSummary::default()
        },
        Kind::Other => EventSummary::default(),
    }
}

/// Calls `on_text` with a delta event's generated text, for counting with a tokenizer (it
/// allocates: only where a tokenizer is configured).
pub fn generated_text(data: &[u8], mut on_text: impl FnMut(&str)) {
    #[derive(Deserialize)]
    struct TextDelta {
        delta: String,
    }
    if let Ok(event) = serde_json::from_slice::<TextDelta>(data) {
        on_text(&event.delta);
    }
}

/// Summarises a whole non-streamed answer: its usage, and whether it failed.
pub fn summarise_body(data: &[u8]) -> EventSummary {
    sonic_rs::from_slice::<ResponseObject>(data)
        .map(ResponseObject::summary)
        .unwrap_or_default()
}

impl ResponseObject {
    fn summary(self) -> EventSummary {
        let failed = self.status.as_deref() == Some("failed");
        let error = match (&self.error, failed) {
            (Some(error), _) => Some(fault_of(error)),
            (None, true) => Some(Fault::Engine),
            (None, false) => None,
        };
        EventSummary {
            usage: self.usage.map(TypedUsage::usage),
            engine: self.metrics.and_then(WireEngineMetrics::timing),
            error,
            ..EventSummary::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::event::Usage;

    #[test]
    fn lifecycle_events_are_not_tokens() {
        for name in [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ] {
            let s = summarise(
                name.as_bytes(),
                br#"{"response":{"status":"in_progress","usage":null}}"#,
            );
            assert_eq!(s, EventSummary::default(), "{name}");
        }
    }

    #[test]
    fn output_text_is_the_answer_and_reasoning_is_not() {
        let text = summarise(
            b"response.output_text.delta",
            br#"{"content_index":0,"delta":"h\u00e9llo","item_id":"msg_1","logprobs":[],"output_index":0,"sequence_number":5,"type":"response.output_text.delta"}"#,
        );
        assert!(text.has_tokens && text.visible && text.answer);
        assert_eq!(text.text_chars, 5);
        let reasoning = summarise(
            b"response.reasoning_text.delta",
            br#"{"delta":"hmm","sequence_number":3}"#,
        );
        assert!(reasoning.visible && !reasoning.answer);
        let tool = summarise(
            b"response.function_call_arguments.delta",
            br#"{"delta":"{\"a\"","item_id":"fc"}"#,
        );
        assert!(tool.visible && !tool.answer);
        let refusal = summarise(b"response.refusal.delta", br#"{"delta":"I can't"}"#);
        assert!(refusal.answer);
        let empty = summarise(b"response.output_text.delta", br#"{"delta":""}"#);
        assert!(!empty.has_tokens);
    }

    #[test]
    fn the_type_in_the_data_stands_in_for_a_missing_event_line() {
        let s = summarise(b"", br#"{"type":"response.output_text.delta","delta":"x"}"#);
        assert!(s.answer);
        let done = summarise(b"", br#"{"type":"response.output_text.done","text":"x"}"#);
        assert!(done.generation_end && !done.done);
    }

    #[test]
    fn completed_and_incomplete_end_the_stream_with_usage() {
        let completed = summarise(
            b"response.completed",
            br#"{"response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":41,"input_tokens_details":{"cached_tokens":0},"output_tokens":32,"output_tokens_details":{"reasoning_tokens":7},"total_tokens":73}},"type":"response.completed"}"#,
        );
        assert!(completed.done && completed.generation_end && completed.error.is_none());
        assert_eq!(
            completed.usage,
            Some(Usage {
                input_tokens: Some(41),
                output_tokens: Some(32),
                reasoning_tokens: Some(7)
            })
        );
        let incomplete = summarise(
            b"response.incomplete",
            br#"{"response":{"status":"incomplete","usage":null}}"#,
        );
        assert!(incomplete.done && incomplete.error.is_none());
    }

    #[test]
    fn failures_and_errors_say_whose_fault() {
        let failed = summarise(
            b"response.failed",
            br#"{"response":{"status":"failed","error":{"code":"server_error","message":"x"}}}"#,
        );
        assert_eq!((failed.done, failed.error), (true, Some(Fault::Engine)));
        let bare = summarise(b"response.failed", br#"{"response":{"status":"failed","error":null}}"#);
        assert_eq!(bare.error, Some(Fault::Engine));
        let invalid = summarise(
            b"error",
            br#"{"type":"error","code":"invalid_request_error","message":"x","param":"top_logprobs"}"#,
        );
        assert_eq!(invalid.error, Some(Fault::Client));
        let overload = summarise(
            b"error",
            br#"{"type":"error","code":"server_is_overloaded","message":"x"}"#,
        );
        assert_eq!(overload.error, Some(Fault::Engine));
        assert_eq!(summarise(b"error", b"not json").error, Some(Fault::Engine));
    }

    #[test]
    fn generated_text_of_a_delta() {
        let mut seen = Vec::new();
        generated_text(br#"{"delta":"h\u00e9","type":"response.output_text.delta"}"#, |t| {
            seen.push(t.to_string())
        });
        generated_text(br#"{"response":{}}"#, |t| seen.push(t.to_string()));
        assert_eq!(seen, ["h\u{e9}"]);
    }

    #[test]
    fn whole_bodies() {
        let ok = summarise_body(
            br#"{"id":"resp_1","object":"response","status":"completed","usage":{"input_tokens":41,"output_tokens":32}}"#,
        );
        assert_eq!(ok.usage.unwrap().output_tokens, Some(32));
        assert!(ok.error.is_none());
        let failed = summarise_body(br#"{"status":"failed","error":{"code":"server_error"}}"#);
        assert_eq!(failed.error, Some(Fault::Engine));
        assert_eq!(summarise_body(b"[1"), EventSummary::default());
    }
}
