//! The lines under the sweep's table: what its derived columns mean, the lengths asked
//! beside the engine's counts, and the APIs that ended requests early.

use super::{Load, Report, StepResult};
use serde_json::Value;
use std::collections::BTreeMap;

impl Report {
    /// What the table's derived columns mean: the sent rate, the cost's formula, the client's
    /// lag and its bound.
    pub(super) fn footnotes(&self) -> String {
        let mut notes = Vec::new();
        if matches!(self.steps.first().map(|s| s.load), Some(Load::Rate(_))) {
            notes.push(
                "sent req/s: the requests sent in the window over its length (random arrivals stray from the \
                 rate asked; --exact-arrivals sends its count)"
                    .to_string(),
            );
        }
        if let Some(price) = self.gpu_hour_price {
            notes.push(format!(
                "cost/1M out: {price} an hour / 3600 × 10⁶ / (output tok/s + {} × prompt tok/s): prompt tokens \
                 weigh {} of an output token (--input-token-weight)",
                self.slos.input_token_weight, self.slos.input_token_weight
            ));
        }
        notes.extend(self.lengths_note());
        notes.extend(self.ended_early_note());
        if let Some(bound) = self.steps.first().map(|s| s.lag_bound_s) {
            notes.push(format!(
                "client lag p99: how late the sweep's own timers and sends ran; ⚠ above {:.1} ms, where a miss \
                 may be the client's",
                bound * 1e3
            ));
        }
        notes.iter().map(|n| format!("\n{n}")).collect()
    }

    /// The lengths asked of every request beside the engine's own counts (its usage), averaged
    /// over the served requests: a fixed workload's prompt and output tokens.
    fn lengths_note(&self) -> Option<String> {
        let asked = |field: &str| self.asked.0.get(field).and_then(Value::as_u64);
        let served = |s: &StepResult| (s.requests - s.failed()) as f64;
        let counted = |of: fn(&StepResult) -> f64| {
            let (sum, weight) = self
                .steps
                .iter()
                .filter(|s| of(s).is_finite() && served(s) > 0.0)
                .fold((0.0, 0.0), |(sum, weight), s| {
                    (sum + of(s) * served(s), weight + served(s))
                });
            if weight > 0.0 {
                format!("{:.1}", sum / weight)
            } else {
                "none".into()
            }
        };
        let mut parts = Vec::new();
        if let Some(tokens) = asked("prompt_tokens") {
            parts.push(format!(
                "{tokens} prompt tokens asked, {} counted",
                counted(|s| s.prompt_tokens_mean)
            ));
        }
        if let Some(tokens) = asked("output_tokens") {
            parts.push(format!(
                "{tokens} output tokens asked, {} counted",
                counted(|s| s.output_tokens_mean)
            ));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "lengths, a request on average by the engine's count: {}",
                parts.join("; ")
            )
        })
    }

    /// The APIs that ended requests before the output tokens they asked, and why: a replay
    /// whose recorded lengths an API would not produce says which API and how often.
    fn ended_early_note(&self) -> Option<String> {
        let mut by_api: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (api, (early, served)) in self.steps.iter().flat_map(|s| &s.ended_early) {
            let entry = by_api.entry(api).or_insert((0, 0));
            *entry = (entry.0 + early, entry.1 + served);
        }
        let apis: Vec<String> = by_api
            .iter()
            .filter(|(_, (early, _))| *early > 0)
            .map(|(api, (early, served))| format!("{api} {early} of {served}"))
            .collect();
        if apis.is_empty() {
            return None;
        }
        let why = if self.asked.0.get("ignore_eos").and_then(Value::as_bool) == Some(true) {
            "every request asked the engine to ignore its end-of-sequence token, so the API named ignores \
             that (vLLM's Messages API does): its requests came back shorter than asked"
        } else {
            "the model ended them first (--ignore-eos asks the engine to go on to the length)"
        };
        Some(format!(
            "output lengths: requests ended before the output tokens they asked ({}): {why}",
            apis.join(", ")
        ))
    }
}
