//! What one stream event (or one whole JSON answer) means for measurement, whatever the
//! wire protocol: each interpreter (`openai`, `responses`, `messages`, `tgi`) reduces its
//! events to an [`EventSummary`], and the stream observer only reads summaries.

use crate::record::{EngineTiming, Fault};
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// Token counts an answer reports, under whatever names its protocol uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (`prompt_tokens`, `input_tokens`; `total_tokens` for pooling answers).
    pub input_tokens: Option<u64>,
    /// Generated tokens (`completion_tokens`, `output_tokens`, TGI's `generated_tokens`).
    pub output_tokens: Option<u64>,
    /// Generated tokens spent on reasoning, where the usage says (`reasoning_tokens`).
    pub reasoning_tokens: Option<u64>,
}

impl Usage {
    /// `self` with every count `newer` states replaced (the Messages API states input tokens
    /// in its first event and output tokens in its last; continuous usage restates both).
    pub fn merged(self, newer: Usage) -> Usage {
        Usage {
            input_tokens: newer.input_tokens.or(self.input_tokens),
            output_tokens: newer.output_tokens.or(self.output_tokens),
            reasoning_tokens: newer.reasoning_tokens.or(self.reasoning_tokens),
        }
    }
}

/// A `metrics` object as vLLM writes it (`PerRequestMetrics`), read field by field: every
/// field may be null, and one that is not a finite number (a string, an object, `NaN`, a
/// number beyond f64) is left out and counted, never the event that carries it.
#[derive(Default)]
pub struct WireEngineMetrics {
    time_to_first_token_ms: Option<f64>,
    queue_time_ms: Option<f64>,
    mean_itl_ms: Option<f64>,
    draft_acceptance_rate: Option<f64>,
    unreadable: u32,
}

/// The fields of `metrics` llmslo reads.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum MetricsField {
    TimeToFirstTokenMs,
    QueueTimeMs,
    MeanItlMs,
    SpeculativeDecoding,
    DraftAcceptanceRate,
    #[serde(other)]
    Other,
}

/// One figure as written: a finite number, nothing (null), or anything else.
enum Figure {
    Number(f64),
    Null,
    Unreadable,
}

impl Figure {
    /// The number, noting an unreadable figure in `unreadable`.
    fn read(self, unreadable: &mut u32) -> Option<f64> {
        match self {
            Figure::Number(v) => Some(v),
            Figure::Null => None,
            Figure::Unreadable => {
                *unreadable += 1;
                None
            }
        }
    }
}

impl<'de> Deserialize<'de> for Figure {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FigureVisitor)
    }
}

/// Reads any JSON value as a [`Figure`], consuming what it is not.
struct FigureVisitor;

impl<'de> Visitor<'de> for FigureVisitor {
    type Value = Figure;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_f64<E>(self, v: f64) -> Result<Figure, E> {
        Ok(if v.is_finite() {
            Figure::Number(v)
        } else {
            Figure::Unreadable
        })
    }
    fn visit_u64<E>(self, v: u64) -> Result<Figure, E> {
        Ok(Figure::Number(v as f64))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Figure, E> {
        Ok(Figure::Number(v as f64))
    }
    fn visit_unit<E>(self) -> Result<Figure, E> {
        Ok(Figure::Null)
    }
    fn visit_none<E>(self) -> Result<Figure, E> {
        Ok(Figure::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Figure, E> {
        Ok(Figure::Unreadable)
    }
    fn visit_str<E>(self, _: &str) -> Result<Figure, E> {
        Ok(Figure::Unreadable)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Figure, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Figure::Unreadable)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Figure, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Figure::Unreadable)
    }
}

impl<'de> Deserialize<'de> for WireEngineMetrics {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(MetricsVisitor)
    }
}

/// Reads `metrics` (and its `speculative_decoding`) field by field; anything but an object is
/// one unreadable field.
struct MetricsVisitor;

impl<'de> Visitor<'de> for MetricsVisitor {
    type Value = WireEngineMetrics;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a metrics object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireEngineMetrics, A::Error> {
        let mut out = WireEngineMetrics::default();
        while let Some(field) = map.next_key::<MetricsField>()? {
            let unreadable = &mut out.unreadable;
            match field {
                MetricsField::TimeToFirstTokenMs => {
                    out.time_to_first_token_ms = map.next_value::<Figure>()?.read(unreadable)
                }
                MetricsField::QueueTimeMs => out.queue_time_ms = map.next_value::<Figure>()?.read(unreadable),
                MetricsField::MeanItlMs => out.mean_itl_ms = map.next_value::<Figure>()?.read(unreadable),
                MetricsField::DraftAcceptanceRate => {
                    out.draft_acceptance_rate = map.next_value::<Figure>()?.read(unreadable)
                }
                MetricsField::SpeculativeDecoding => {
                    let inner = map.next_value::<WireEngineMetrics>()?;
                    out.draft_acceptance_rate = inner.draft_acceptance_rate;
                    out.unreadable += inner.unreadable;
                }
                MetricsField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
    fn visit_unit<E>(self) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::default())
    }
    fn visit_none<E>(self) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::unreadable())
    }
    fn visit_str<E>(self, _: &str) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::unreadable())
    }
    fn visit_f64<E>(self, _: f64) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::unreadable())
    }
    fn visit_u64<E>(self, _: u64) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::unreadable())
    }
    fn visit_i64<E>(self, _: i64) -> Result<WireEngineMetrics, E> {
        Ok(WireEngineMetrics::unreadable())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireEngineMetrics, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(WireEngineMetrics::unreadable())
    }
}

impl WireEngineMetrics {
    fn unreadable() -> Self {
        Self {
            unreadable: 1,
            ..Self::default()
        }
    }

    /// The timing it states, in seconds; a negative figure is left out (and counted).
    pub fn timing(self) -> Option<EngineTiming> {
        let mut unreadable = self.unreadable;
        let mut possible = |v: Option<f64>, range: std::ops::RangeInclusive<f64>| match v {
            Some(v) if range.contains(&v) => Some(v),
            Some(_) => {
                unreadable += 1;
                None
            }
            None => None,
        };
        let ms = 0.0..=f64::MAX;
        let timing = EngineTiming {
            queue: possible(self.queue_time_ms, ms.clone()).map(|ms| ms / 1e3),
            prefill: possible(self.time_to_first_token_ms, ms.clone()).map(|ms| ms / 1e3),
            tpot: possible(self.mean_itl_ms, ms).map(|ms| ms / 1e3),
            draft_acceptance: possible(self.draft_acceptance_rate, 0.0..=1.0),
            unreadable: 0,
            inconsistent: 0,
        };
        let timing = EngineTiming { unreadable, ..timing };
        (timing != EngineTiming::default()).then_some(timing)
    }
}

/// `data` with every number JSON cannot carry (`NaN`, `Infinity`, `-Infinity` as Python
/// writes them, and numbers beyond f64) quoted into a string, so that the event still parses
/// and only those fields are unreadable; `None` when there are none.
pub fn with_odd_numbers_quoted(data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() + 8);
    let mut changed = false;
    let mut i = 0;
    while i < data.len() {
        let start = i;
        match data[i] {
            b'"' => {
                i += 1;
                while i < data.len() {
                    match data[i] {
                        b'\\' => i += 2,
                        b'"' => {
                            i += 1;
                            break;
                        }
                        _ => i += 1,
                    }
                }
                out.extend_from_slice(&data[start..i.min(data.len())]);
            }
            b'-' | b'0'..=b'9' | b'N' | b'I' => {
                while i < data.len() && (data[i].is_ascii_alphanumeric() || matches!(data[i], b'.' | b'+' | b'-')) {
                    i += 1;
                }
                let token = &data[start..i];
                let odd = matches!(token, b"NaN" | b"Infinity" | b"-Infinity")
                    || std::str::from_utf8(token)
                        .ok()
                        .and_then(|t| t.parse::<f64>().ok())
                        .is_some_and(f64::is_infinite);
                if odd {
                    out.push(b'"');
                    out.extend_from_slice(token);
                    out.push(b'"');
                    changed = true;
                } else {
                    out.extend_from_slice(token);
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

/// What one stream event means for measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EventSummary {
    /// The event carries at least one generated token (possibly held-back, empty text).
    pub has_tokens: bool,
    /// The event carries visible generated content of any kind: the first such event is the
    /// first token.
    pub visible: bool,
    /// The visible content includes the answer itself (not reasoning, not a tool call's
    /// arguments): the first such event is the first answer token.
    pub answer: bool,
    /// The `index` of the choice that carried the tokens (the first one, when several did).
    pub choice: u32,
    /// Tokens the event states explicitly (`token_ids` or `logprobs.content` lengths), if any.
    pub explicit_tokens: Option<u64>,
    /// Characters of generated text the event carries, where the protocol sends no empty
    /// deltas for held-back tokens (Responses, Messages): how the first delta's share of the
    /// tokens is estimated.
    pub text_chars: u32,
    /// The event's usage, if any (the usage-only chunk, continuous usage, a terminal event).
    pub usage: Option<Usage>,
    /// The event is a usage-only chunk (`choices: []` with usage).
    pub usage_only: bool,
    /// The engine's own timing of the request, where the event states it.
    pub engine: Option<EngineTiming>,
    /// The event reports an error, and whose fault it is.
    pub error: Option<Fault>,
    /// The event ends the stream (`[DONE]`, TGI's final event, `response.completed`,
    /// `message_stop`).
    pub done: bool,
    /// Its only token-carrying choices hold empty text and a `finish_reason`: a held-back
    /// last token for vLLM, no token at all for llama.cpp.
    pub finish_only: bool,
    /// The engine sends this event with the first generated token although it carries no
    /// text (vLLM's Messages `message_start`): where the decode clock starts.
    pub first_token_mark: bool,
    /// The event closes generated output (a Responses `*.done`, a Messages
    /// `content_block_stop` or `message_delta`): it is sent with the last generated token,
    /// whose text may have been held back from every delta.
    pub generation_end: bool,
}

/// Whose fault the error payload `error` is: an OpenAI `{"message", "type", "code"}` object,
/// an Anthropic `{"type": "error", "error": {"type"}}` event, a Responses `error` event or
/// `response.error`, or a bare string (TGI).
pub fn fault_of(error: &Value) -> Fault {
    let inner = error.get("error").filter(|e| e.is_object()).unwrap_or(error);
    let code = inner.get("code").or_else(|| error.get("code"));
    let status = code.and_then(|c| c.as_u64().or_else(|| c.as_str()?.parse().ok()));
    if let Some(status) = status {
        // 408 and 429 say the engine could not keep up, not that the request was wrong.
        let client = (400..500).contains(&status) && status != 408 && status != 429;
        return if client { Fault::Client } else { Fault::Engine };
    }
    let names = [
        inner.get("type"),
        code,
        error.get("type").filter(|_| !std::ptr::eq(inner, error)),
    ];
    let client = names
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(is_client_error_name);
    if client {
        Fault::Client
    } else {
        Fault::Engine
    }
}

/// Error type or code names that say the request itself was invalid, compared without case,
/// `_`, `-` or spaces (`invalid_request_error`, `BadRequestError`, `Bad Request`).
fn is_client_error_name(name: &str) -> bool {
    const CLIENT: [&str; 14] = [
        "invalidrequesterror",
        "invalidrequest",
        "badrequesterror",
        "badrequest",
        "notfounderror",
        "notfound",
        "authenticationerror",
        "permissionerror",
        "requesttoolarge",
        "unprocessableentity",
        "unprocessableentityerror",
        "validationerror",
        "invalidprompt",
        "contextlengthexceeded",
    ];
    let folded: String = name
        .chars()
        .filter(|c| !matches!(c, '_' | '-' | ' '))
        .flat_map(char::to_lowercase)
        .collect();
    CLIENT.contains(&folded.as_str())
}

/// A `usage` object of the typed APIs (Responses, Messages): `input_tokens`, `output_tokens`
/// and, on the Responses API, `output_tokens_details.reasoning_tokens`.
#[derive(Deserialize)]
pub struct TypedUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl TypedUsage {
    /// The counts it states.
    pub fn usage(self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: self.output_tokens_details.and_then(|d| d.reasoning_tokens),
        }
    }
}

/// Whose fault an `error` event's data says it is (the engine's, when it cannot be read).
pub fn fault_of_event(data: &[u8]) -> Fault {
    sonic_rs::from_slice::<Value>(data).map_or(Fault::Engine, |error| fault_of(&error))
}

/// The event's type: its `event:` field, or the `type` its data states when it has none.
pub fn event_name<'a>(event_type: &'a [u8], data: &[u8]) -> Cow<'a, [u8]> {
    if !event_type.is_empty() {
        return Cow::Borrowed(event_type);
    }
    let stated = sonic_rs::get(data, ["type"])
        .ok()
        .and_then(|value| sonic_rs::JsonValueTrait::as_str(&value).map(|s| s.as_bytes().to_vec()));
    Cow::Owned(stated.unwrap_or_default())
}

/// The length in characters of a JSON string, learned without keeping it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextChars(pub u32);

impl<'de> Deserialize<'de> for TextChars {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CharsVisitor;
        impl serde::de::Visitor<'_> for CharsVisitor {
            type Value = TextChars;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<TextChars, E> {
                Ok(TextChars(u32::try_from(s.chars().count()).unwrap_or(u32::MAX)))
            }
        }
        d.deserialize_str(CharsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn invalid_requests_are_the_clients_fault() {
        for error in [
            json!({"message": "logprobs", "type": "BadRequestError", "param": "logprobs", "code": 400}),
            json!({"message": "x", "type": "Bad Request", "code": 422}),
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}),
            json!({"type": "error", "code": "invalid_prompt", "message": "x"}),
            json!({"code": "400", "message": "as a string"}),
            json!({"type": "NotFoundError", "message": "x"}),
        ] {
            assert_eq!(fault_of(&error), Fault::Client, "{error}");
        }
    }

    #[test]
    fn overload_internal_and_unknown_errors_are_the_engines() {
        for error in [
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
            json!({"message": "x", "type": "InternalServerError", "code": 500}),
            json!({"code": "server_error", "message": "x"}),
            json!({"message": "slow down", "code": 429}),
            json!({"message": "x", "code": 408, "type": "BadRequestError"}),
            json!("Request failed during generation"),
            json!({}),
        ] {
            assert_eq!(fault_of(&error), Fault::Engine, "{error}");
        }
    }

    fn metrics(json: &str) -> Option<EngineTiming> {
        let parsed = sonic_rs::from_slice::<WireEngineMetrics>(json.as_bytes())
            .ok()
            .or_else(|| sonic_rs::from_slice(&with_odd_numbers_quoted(json.as_bytes())?).ok());
        parsed.and_then(WireEngineMetrics::timing)
    }

    #[test]
    fn each_engine_metrics_field_is_read_on_its_own() {
        let good = metrics(r#"{"queue_time_ms": 5, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#).unwrap();
        assert_eq!(
            (good.queue, good.prefill, good.tpot, good.unreadable),
            (Some(0.005), Some(0.0205), Some(0.01), 0)
        );
        for bad in [
            r#"{"queue_time_ms": NaN, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
            r#"{"queue_time_ms": Infinity, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
            r#"{"queue_time_ms": -Infinity, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
            r#"{"queue_time_ms": 1e999, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
            r#"{"queue_time_ms": "5", "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
            r#"{"queue_time_ms": {"ms": 5}, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
            r#"{"queue_time_ms": -5, "time_to_first_token_ms": 20.5, "mean_itl_ms": 10}"#,
        ] {
            let timing = metrics(bad).unwrap_or_else(|| panic!("{bad}"));
            assert_eq!(timing.queue, None, "{bad}");
            assert_eq!((timing.prefill, timing.tpot), (Some(0.0205), Some(0.01)), "{bad}");
            assert_eq!(timing.unreadable, 1, "{bad}");
        }
        let spec = metrics(r#"{"speculative_decoding": {"draft_acceptance_rate": 7}}"#).unwrap();
        assert_eq!((spec.draft_acceptance, spec.unreadable), (None, 1));
        assert_eq!(metrics(r#""soon""#).unwrap().unreadable, 1, "not an object");
    }

    #[test]
    fn only_numbers_outside_strings_are_quoted() {
        let data = br#"{"a":"NaN -Infinity 1e999","b":NaN,"c":[1e999,-Infinity,2.5e3],"d":true}"#;
        let quoted = with_odd_numbers_quoted(data).unwrap();
        assert_eq!(
            std::str::from_utf8(&quoted).unwrap(),
            r#"{"a":"NaN -Infinity 1e999","b":"NaN","c":["1e999","-Infinity",2.5e3],"d":true}"#
        );
        assert_eq!(with_odd_numbers_quoted(br#"{"a":1.5,"b":"x\"NaN"}"#), None);
    }

    #[test]
    fn usage_merges_newer_counts_over_older() {
        let start = Usage {
            input_tokens: Some(41),
            ..Usage::default()
        };
        let end = Usage {
            output_tokens: Some(32),
            ..Usage::default()
        };
        let merged = start.merged(end);
        assert_eq!((merged.input_tokens, merged.output_tokens), (Some(41), Some(32)));
    }
}
