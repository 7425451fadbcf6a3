//! What a sweep was asked to send, saved with its results: the API, the lengths, the loads,
//! the arrivals and the trace or shape. Two saved results compare only when they asked the
//! same; the first field that differs is named.

use serde_json::{Map, Value};

/// The fields, in the order a difference is looked for.
pub const FIELDS: [&str; 8] = [
    "endpoint",
    "workload",
    "prompt_tokens",
    "output_tokens",
    "dataset",
    "ignore_eos",
    "loads",
    "arrivals",
];

/// What one sweep asked, as saved.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked(pub Map<String, Value>);

impl Asked {
    /// The first field in which `self` (A) and `other` (B) differ, as a sentence.
    pub fn difference(&self, other: &Asked) -> Option<String> {
        let shown = |v: Option<&Value>| match v {
            None | Some(Value::Null) => "not set".to_string(),
            Some(Value::String(s)) => format!("`{}`", crate::flags::terminal_safe(&bounded(s))),
            Some(v) => format!("`{v}`"),
        };
        FIELDS.iter().find_map(|field| {
            let (a, b) = (self.0.get(*field), other.0.get(*field));
            let same = a.unwrap_or(&Value::Null) == b.unwrap_or(&Value::Null);
            (!same).then(|| format!("`{field}` is {} in A and {} in B", shown(a), shown(b)))
        })
    }

    /// How a step gets more requests: a replay's window is its trace.
    pub fn more_requests(&self) -> &'static str {
        let replay = self
            .0
            .get("workload")
            .and_then(Value::as_str)
            .is_some_and(|w| w.starts_with("replay of"));
        if replay {
            "replay a longer trace"
        } else {
            "lengthen --duration"
        }
    }
}

/// Longest string read back from a saved sweep and shown in a message.
const MAX_SHOWN_CHARS: usize = 200;

/// A string from a saved sweep, cut to a length a message can hold.
pub fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(pairs: &[(&str, Value)]) -> Asked {
        Asked(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
    }

    #[test]
    fn the_first_differing_field_is_named() {
        let a = asked(&[
            ("endpoint", json!("chat")),
            ("output_tokens", json!(128)),
            ("loads", json!("rate 1,2")),
        ]);
        let b = asked(&[
            ("endpoint", json!("chat")),
            ("output_tokens", json!(64)),
            ("loads", json!("rate 1,4")),
        ]);
        assert_eq!(a.difference(&b).unwrap(), "`output_tokens` is `128` in A and `64` in B");
        assert_eq!(a.difference(&a.clone()), None);
        let c = asked(&[("endpoint", json!("chat")), ("output_tokens", json!(128))]);
        assert_eq!(a.difference(&c).unwrap(), "`loads` is `rate 1,2` in A and not set in B");
    }

    #[test]
    fn a_replay_gets_more_requests_from_a_longer_trace() {
        assert_eq!(
            asked(&[("workload", json!("replay of t.jsonl (40 requests)"))]).more_requests(),
            "replay a longer trace"
        );
        assert_eq!(
            asked(&[("workload", json!("synthetic prompts"))]).more_requests(),
            "lengthen --duration"
        );
    }
}
