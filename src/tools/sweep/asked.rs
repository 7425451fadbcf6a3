//! What a sweep was asked to send, saved with its results: the API, the lengths, the loads,
//! the arrivals and the trace or shape. Two saved results compare only when they asked the
//! same; the first field that differs is named.

use super::load::Arrivals;
use super::{LoadPlan, SweepOptions, Workload};
use serde_json::{json, Map, Value};

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
    /// What `options` ask.
    pub fn of(options: &SweepOptions) -> Self {
        let fixed = matches!(options.workload, Workload::Fixed);
        let workload = match (&options.workload, &options.dataset) {
            (Workload::Fixed, None) => json!("synthetic prompts"),
            (Workload::Fixed, Some(_)) => json!("dataset"),
            (Workload::Replay { name, trace }, _) => {
                json!(format!("replay of {name} ({} requests)", trace.rows.len()))
            }
            (Workload::Shape(shape), _) => json!(shape.describe().trim().replace('\n', "; ")),
        };
        let dataset = options
            .dataset
            .as_ref()
            .filter(|_| fixed)
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        let mut map = Map::new();
        map.insert("endpoint".into(), json!(options.endpoint.api()));
        map.insert("workload".into(), workload);
        map.insert(
            "prompt_tokens".into(),
            json!((fixed && options.dataset.is_none()).then_some(options.prompt_tokens)),
        );
        map.insert("output_tokens".into(), json!(fixed.then_some(options.output_tokens)));
        map.insert("dataset".into(), json!(dataset));
        map.insert("ignore_eos".into(), json!(options.ignore_eos));
        map.insert("loads".into(), json!(loads(&options.loads)));
        let open_loop = matches!(options.loads, LoadPlan::Rate(_) | LoadPlan::AutoRate { .. });
        let arrivals = match &options.workload {
            Workload::Replay { .. } => Some("the trace's own times".to_string()),
            _ => open_loop.then(|| arrivals(&options.arrivals)),
        };
        map.insert("arrivals".into(), json!(arrivals));
        Self(map)
    }

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

/// A saved string, cut to a length a message can hold.
fn bounded(s: &str) -> String {
    const MAX: usize = 120;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// The loads as asked: a list, or a search and its bounds.
fn loads(plan: &LoadPlan) -> String {
    let list = |values: Vec<String>| values.join(",");
    match plan {
        LoadPlan::Concurrency(levels) => format!("concurrency {}", list(levels.iter().map(usize::to_string).collect())),
        LoadPlan::Auto { max } => format!("concurrency auto up to {max}"),
        LoadPlan::Rate(rates) => format!("rate {}", list(rates.iter().map(|r| format!("{r}")).collect())),
        LoadPlan::AutoRate { start, max } => format!("rate auto from {start} up to {max}"),
    }
}

/// How open-loop arrivals were spaced.
fn arrivals(arrivals: &Arrivals) -> String {
    match arrivals {
        Arrivals::Gamma { burstiness } if *burstiness == 1.0 => "poisson".to_string(),
        Arrivals::Gamma { burstiness } => format!("gamma, burstiness {burstiness}"),
        Arrivals::Bursts(b) => format!("bursts {:?} on, {:?} off", b.on, b.off),
        Arrivals::Exact => "exact count, uniform times".to_string(),
        Arrivals::Trace(_) => "the trace's own times".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
