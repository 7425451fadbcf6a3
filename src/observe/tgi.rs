//! Interpretation of TGI's native generate API: `/generate_stream` events and
//! `/generate` bodies.
//!
//! A stream event is `{"index", "token": {"id","text","logprob","special"}, "generated_text",
//! "details"}`; the last one carries `generated_text` (and `details.generated_tokens` when
//! details were asked for). There is no `[DONE]`: the final event plays its part. Errors are
//! `{"error": "...", "error_type": "..."}`, e.g. `incomplete_generation_stream`.

use super::event::{EventSummary, Usage};
use crate::record::Fault;
use serde::de::IgnoredAny;
use serde::Deserialize;

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    token: Option<Token>,
    #[serde(default)]
    generated_text: Option<IgnoredAny>,
    #[serde(default)]
    details: Option<Details>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    error_type: Option<String>,
}

#[derive(Deserialize)]
struct Token {
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    generated_tokens: Option<u64>,
}

/// Summarises one `/generate_stream` event, or a whole `/generate` body (an object, or an
/// array holding one).
pub fn summarise(data: &[u8]) -> EventSummary {
    // Checked first: a derived struct would also accept an array as its fields in order.
    let parsed = if data.trim_ascii_start().starts_with(b"[") {
        sonic_rs::from_slice::<(Event,)>(data).map(|(first,)| first)
    } else {
        sonic_rs::from_slice::<Event>(data)
    };
    let Ok(event) = parsed else {
        return EventSummary::default();
    };
    let completion_tokens = event.details.and_then(|d| d.generated_tokens);
    let visible = event.token.as_ref().is_some_and(|t| !t.special);
    // TGI rejects an invalid request with `error_type: validation`; every other error is its own.
    let fault = match event.error_type.as_deref() {
        Some("validation") => Fault::Client,
        _ => Fault::Engine,
    };
    EventSummary {
        has_tokens: event.token.is_some(),
        visible,
        answer: visible,
        // Every TGI stream event is exactly one token.
        explicit_tokens: event.token.is_some().then_some(1),
        usage: completion_tokens.map(|n| Usage {
            output_tokens: Some(n),
            ..Usage::default()
        }),
        error: event.error.is_some().then_some(fault),
        done: event.generated_text.is_some(),
        ..EventSummary::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_events() {
        let s = summarise(br#"{"index":1,"token":{"id":42,"text":" Hi","logprob":-0.3,"special":false},"generated_text":null,"details":null}"#);
        assert!(s.has_tokens && s.visible && s.answer && !s.done);
    }

    #[test]
    fn special_tokens_count_but_are_not_content() {
        let s = summarise(br#"{"index":9,"token":{"id":2,"text":"</s>","logprob":0.0,"special":true},"generated_text":null,"details":null}"#);
        assert!(s.has_tokens && !s.visible);
    }

    #[test]
    fn final_event_ends_the_stream_and_reports_tokens() {
        let s = summarise(br#"{"index":20,"token":{"id":5,"text":".","logprob":-1.0,"special":false},"generated_text":"a b.","details":{"finish_reason":"length","generated_tokens":20,"seed":null}}"#);
        assert!(s.done && s.visible);
        assert_eq!(s.usage.unwrap().output_tokens, Some(20));
        let no_details = summarise(
            br#"{"index":3,"token":{"id":5,"text":".","special":false},"generated_text":"abc","details":null}"#,
        );
        assert!(no_details.done && no_details.usage.is_none());
    }

    #[test]
    fn errors_and_whole_bodies() {
        let e =
            summarise(br#"{"error":"Request failed during generation","error_type":"incomplete_generation_stream"}"#);
        assert!(e.error == Some(Fault::Engine) && !e.has_tokens);
        let invalid =
            summarise(br#"{"error":"Input validation error: `inputs` must not be empty","error_type":"validation"}"#);
        assert_eq!(invalid.error, Some(Fault::Client));
        let body = summarise(br#"{"generated_text":"x","details":{"finish_reason":"length","generated_tokens":7}}"#);
        assert_eq!(body.usage.unwrap().output_tokens, Some(7));
        let array = summarise(br#"[{"generated_text":"x","details":{"generated_tokens":3}}]"#);
        assert_eq!(array.usage.unwrap().output_tokens, Some(3));
        assert_eq!(summarise(b"nope"), EventSummary::default());
    }
}
