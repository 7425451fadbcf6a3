//! The SLO file: service, period, minimum events, the SLOs and goodput.
//! It lives in the same YAML file as the rest of the configuration.

use crate::cost::{CostSlo, DEFAULT_INPUT_TOKEN_WEIGHT};
use crate::record::LabelText;
use serde::Deserialize;
use std::time::Duration;

/// `period` when none is given.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(30 * 24 * 3600);
/// `min_events` when none is given.
pub const DEFAULT_MIN_EVENTS: u64 = 20;

/// The SLO keys of the config file, as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloFile {
    /// `slos:` entries.
    #[serde(default)]
    pub slos: Vec<SloEntry>,
    /// `goodput:`.
    #[serde(default)]
    pub goodput: Option<GoodputEntry>,
}

/// One `slos:` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloEntry {
    /// `name`.
    pub name: String,
    /// `objective`, percent of valid requests: `99.9`, or `"99.9%"`.
    #[serde(deserialize_with = "percent")]
    pub objective: f64,
    /// `ttft`: threshold on time to first token.
    #[serde(default, with = "humantime_serde")]
    pub ttft: Option<Duration>,
    /// `answer_ttft`: threshold on time to the first token of the answer (after reasoning).
    #[serde(default, with = "humantime_serde")]
    pub answer_ttft: Option<Duration>,
    /// `tpot`: threshold on time per output token.
    #[serde(default, with = "humantime_serde")]
    pub tpot: Option<Duration>,
    /// `e2e`: threshold on the whole request.
    #[serde(default, with = "humantime_serde")]
    pub e2e: Option<Duration>,
    /// `availability: true`.
    #[serde(default)]
    pub availability: bool,
    /// `max_prompt_tokens`: a TTFT SLO judges only requests with at most this many prompt
    /// tokens (longer prompts are prefill, not a fault).
    #[serde(default)]
    pub max_prompt_tokens: Option<u64>,
    /// `per_1k_prompt_tokens`: a TTFT SLO's threshold grows by this for every 1000 prompt
    /// tokens.
    #[serde(default, with = "humantime_serde")]
    pub per_1k_prompt_tokens: Option<Duration>,
    /// `runbook_url`, carried into the alerts' annotations.
    #[serde(default)]
    pub runbook_url: Option<String>,
}

/// A percentage as written: a number, or a string with or without its `%` sign.
fn percent<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    struct Percent;
    impl serde::de::Visitor<'_> for Percent {
        type Value = f64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a percentage like 99.9 or \"99.9%\"")
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<f64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<f64, E> {
            Ok(v as f64)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<f64, E> {
            let number = v.trim().strip_suffix('%').unwrap_or(v.trim()).trim();
            number
                .parse()
                .map_err(|_| E::invalid_type(serde::de::Unexpected::Str(v), &self))
        }
    }
    deserializer.deserialize_any(Percent)
}

/// `goodput:` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoodputEntry {
    /// `goodput.require`: the SLOs a request must meet to count as goodput.
    #[serde(default)]
    pub require: Vec<String>,
}

/// What an SLO judges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SloKind {
    /// Successful streamed requests with TTFT at most this.
    Ttft(Duration),
    /// Successful streamed requests whose first answer token (after any reasoning) came
    /// within this.
    AnswerTtft(Duration),
    /// Successful streamed requests with TPOT at most this.
    Tpot(Duration),
    /// Successful requests that completed within this.
    E2e(Duration),
    /// Requests the service answered (bad: upstream_error, timeout, connect_error).
    Availability,
}

/// One validated SLO.
#[derive(Debug, Clone, PartialEq)]
pub struct Slo {
    /// Its name, the `slo` label.
    pub name: LabelText,
    /// Target fraction of good events (0.99 for `objective: 99`).
    pub objective: f64,
    /// What it judges.
    pub kind: SloKind,
    /// How a TTFT SLO accounts for prompt length (nothing for the other kinds).
    pub prompt: PromptAllowance,
    /// Runbook link for its alerts.
    pub runbook_url: String,
}

/// How a TTFT SLO accounts for prompt length.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptAllowance {
    /// Only requests with at most this many prompt tokens are judged.
    pub max_prompt_tokens: Option<u64>,
    /// Added to the threshold for every 1000 prompt tokens.
    pub per_1k_prompt_tokens: Duration,
}

impl PromptAllowance {
    /// Whether a request with `prompt_tokens` (unknown: judged) is judged at all.
    pub fn judges(&self, prompt_tokens: Option<u64>) -> bool {
        match (self.max_prompt_tokens, prompt_tokens) {
            (Some(max), Some(n)) => n <= max,
            _ => true,
        }
    }

    /// The threshold for a request with `prompt_tokens` (unknown: no allowance).
    pub fn threshold(&self, base: Duration, prompt_tokens: Option<u64>) -> Duration {
        base + self
            .per_1k_prompt_tokens
            .mul_f64(prompt_tokens.unwrap_or(0) as f64 / 1000.0)
    }

    /// Whether it changes anything.
    pub fn is_set(&self) -> bool {
        self.max_prompt_tokens.is_some() || !self.per_1k_prompt_tokens.is_zero()
    }
}

impl Slo {
    /// The error budget: the fraction of events allowed to be bad.
    pub fn error_budget(&self) -> f64 {
        tidy(1.0 - self.objective)
    }

    /// The objective in percent, as written.
    pub fn objective_percent(&self) -> f64 {
        tidy(self.objective * 100.0)
    }
}

/// The validated SLO set.
#[derive(Debug, Clone, PartialEq)]
pub struct SloSet {
    /// `service`, for the rules' `sloth_service` label.
    pub service: LabelText,
    /// The SLO period (budget window).
    pub period: Duration,
    /// Below this many events in a window, ratios and burn rates are NaN.
    pub min_events: u64,
    /// The SLOs, in file order.
    pub slos: Vec<Slo>,
    /// Indices into `slos` a request must meet to count as goodput (empty: every SLO).
    pub goodput_require: Vec<usize>,
    /// Whether the SLOs are judged per tenant too (tenants are configured): the rules then
    /// keep a `tenant` label beside `model`.
    pub per_tenant: bool,
    /// The cost SLOs (`cost.slos`), for the rules.
    pub cost_slos: Vec<CostSlo>,
    /// An input token's GPU time relative to an output token's (`cost.input_token_weight`).
    pub input_token_weight: f64,
    /// The target labels that say where a pod runs (`fleet_labels`, default `namespace`): every
    /// fleet rule keeps them, so each namespace (cluster, …) is judged and alerted on its own.
    pub fleet_labels: Vec<LabelText>,
}

/// `fleet_labels` when none are given.
pub fn default_fleet_labels() -> Vec<LabelText> {
    vec![LabelText::from("namespace")]
}

/// Labels the rules use for something else, or that name one pod: never a fleet label.
const NOT_FLEET_LABELS: [&str; 10] = [
    "model",
    "le",
    "slo",
    "slo_service",
    "tenant",
    "instance",
    "pod",
    "outcome",
    "operation",
    "window",
];

impl SloSet {
    /// Whether the SLO at `index` decides goodput, the knee and the capacity: listed under
    /// `goodput.require`, or any SLO when that list is empty. One rule for the live gauges,
    /// the capacity estimate and the sweep.
    pub fn decides_goodput(&self, index: usize) -> bool {
        self.goodput_require.is_empty() || self.goodput_require.contains(&index)
    }

    /// Whether goodput is judged at all: not without SLOs (its gauges then read NaN).
    pub fn judges_goodput(&self) -> bool {
        !self.slos.is_empty()
    }
}

impl Default for SloSet {
    fn default() -> Self {
        Self {
            service: "llm".into(),
            period: DEFAULT_PERIOD,
            min_events: DEFAULT_MIN_EVENTS,
            slos: Vec::new(),
            goodput_require: Vec::new(),
            per_tenant: false,
            cost_slos: Vec::new(),
            input_token_weight: DEFAULT_INPUT_TOKEN_WEIGHT,
            fleet_labels: default_fleet_labels(),
        }
    }
}

/// A validation error: the key path and what is wrong.
pub type SpecError = (String, String);

impl SloSet {
    /// The set with `labels` as its fleet labels, each a Prometheus label name the rules do
    /// not use for something else, given once.
    pub fn with_fleet_labels(self, labels: Vec<LabelText>) -> Result<Self, SpecError> {
        for (i, label) in labels.iter().enumerate() {
            let key = format!("fleet_labels[{i}]");
            let name = label.as_str();
            let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with("__");
            if !valid {
                return Err((
                    key,
                    format!("`{name}` is not a Prometheus label name (letters, digits and _)"),
                ));
            }
            if NOT_FLEET_LABELS.contains(&name) || name.starts_with("sloth_") {
                return Err((
                    key,
                    format!("`{name}` is a label the rules use for something else, or names one pod; name where pods run, like namespace or cluster"),
                ));
            }
            if labels[..i].contains(label) {
                return Err((key, format!("`{name}` is given twice")));
            }
        }
        Ok(Self {
            fleet_labels: labels,
            ..self
        })
    }
}

impl SloSet {
    /// Validates the written entries with the top-level `service`, `period` and `min_events`.
    pub fn validate(
        service: Option<String>,
        period: Option<Duration>,
        min_events: Option<u64>,
        file: SloFile,
    ) -> Result<Self, SpecError> {
        let invalid = |key: String, message: &str| Err((key, message.to_string()));
        let service = service.unwrap_or_else(|| "llm".to_string());
        if !is_label_safe(&service) {
            return invalid("service".into(), "use letters, digits, `-` and `_` only");
        }
        let period = period.unwrap_or(DEFAULT_PERIOD);
        if period < Duration::from_secs(3600) {
            return invalid("period".into(), "must be at least 1h");
        }
        let mut slos: Vec<Slo> = Vec::new();
        for (i, entry) in file.slos.into_iter().enumerate() {
            let key = |field: &str| format!("slos[{i}].{field}");
            if !is_label_safe(&entry.name) {
                return invalid(key("name"), "use letters, digits, `-` and `_` only");
            }
            if slos.iter().any(|s| s.name == entry.name) {
                return invalid(key("name"), "is used by an earlier SLO");
            }
            let objective = entry.objective;
            if objective > 0.0 && objective <= 1.0 {
                let percent = tidy(objective * 100.0);
                return invalid(
                    key("objective"),
                    &format!(
                        "is a percentage: {objective} means {objective} % of requests, not {percent} %; \
                         did you mean {percent}?"
                    ),
                );
            }
            if !(objective > 0.0 && objective < 100.0) {
                return invalid(
                    key("objective"),
                    "must be a percentage above 0 and below 100, like 99.9",
                );
            }
            let kinds: Vec<SloKind> = [
                entry.ttft.map(SloKind::Ttft),
                entry.answer_ttft.map(SloKind::AnswerTtft),
                entry.tpot.map(SloKind::Tpot),
                entry.e2e.map(SloKind::E2e),
                entry.availability.then_some(SloKind::Availability),
            ]
            .into_iter()
            .flatten()
            .collect();
            let kind = match kinds.as_slice() {
                [kind] => *kind,
                [] => {
                    return invalid(
                        key("name"),
                        "needs one of ttft, answer_ttft, tpot, e2e or availability: true",
                    )
                }
                _ => {
                    return invalid(
                        key("name"),
                        "sets more than one of ttft, answer_ttft, tpot, e2e and availability",
                    )
                }
            };
            if let SloKind::Ttft(d) | SloKind::AnswerTtft(d) | SloKind::Tpot(d) | SloKind::E2e(d) = kind {
                if d.is_zero() {
                    let field = match kind {
                        SloKind::Ttft(_) => "ttft",
                        SloKind::AnswerTtft(_) => "answer_ttft",
                        SloKind::Tpot(_) => "tpot",
                        _ => "e2e",
                    };
                    return invalid(key(field), "must be longer than zero");
                }
            }
            let prompt = PromptAllowance {
                max_prompt_tokens: entry.max_prompt_tokens,
                per_1k_prompt_tokens: entry.per_1k_prompt_tokens.unwrap_or_default(),
            };
            if prompt.is_set() && !matches!(kind, SloKind::Ttft(_) | SloKind::AnswerTtft(_)) {
                let field = if entry.max_prompt_tokens.is_some() {
                    "max_prompt_tokens"
                } else {
                    "per_1k_prompt_tokens"
                };
                return invalid(
                    key(field),
                    "applies to ttft and answer_ttft SLOs only (prompt length is what prefill costs)",
                );
            }
            if prompt.max_prompt_tokens == Some(0) {
                return invalid(key("max_prompt_tokens"), "must be at least 1");
            }
            slos.push(Slo {
                name: entry.name.into(),
                objective: tidy(entry.objective / 100.0),
                kind,
                prompt,
                runbook_url: entry.runbook_url.unwrap_or_default(),
            });
        }
        let mut goodput_require = Vec::new();
        for (i, name) in file.goodput.map(|g| g.require).unwrap_or_default().iter().enumerate() {
            match slos.iter().position(|s| &s.name == name) {
                Some(index) if !goodput_require.contains(&index) => goodput_require.push(index),
                Some(_) => return invalid(format!("goodput.require[{i}]"), "is listed twice"),
                None => {
                    let nearest = slos
                        .iter()
                        .map(|s| (strsim::damerau_levenshtein(name, &s.name), s.name.as_str()))
                        .min()
                        .filter(|(distance, _)| *distance <= 3);
                    let names: Vec<&str> = slos.iter().map(|s| s.name.as_str()).collect();
                    let hint = match nearest {
                        Some((_, near)) => format!(" (did you mean `{near}`?)"),
                        None => format!("; the SLOs are: {}", names.join(", ")),
                    };
                    return invalid(
                        format!("goodput.require[{i}]"),
                        &format!("names no SLO: `{name}`{hint}"),
                    );
                }
            }
        }
        Ok(Self {
            service: service.into(),
            period,
            min_events: min_events.unwrap_or(DEFAULT_MIN_EVENTS),
            slos,
            goodput_require,
            per_tenant: false,
            cost_slos: Vec::new(),
            input_token_weight: DEFAULT_INPUT_TOKEN_WEIGHT,
            fleet_labels: default_fleet_labels(),
        })
    }

    /// Every latency threshold of `pick`'s kind, in seconds (for exact histogram bucket edges).
    pub fn thresholds(&self, pick: fn(SloKind) -> Option<Duration>) -> Vec<f64> {
        self.slos
            .iter()
            .filter_map(|s| pick(s.kind))
            .map(|d| d.as_secs_f64())
            .collect()
    }
}

/// Rounds away binary noise (1 - 0.999 = 0.0009999999999998899) for printing and rules.
fn tidy(x: f64) -> f64 {
    (x * 1e9).round() / 1e9
}

fn is_label_safe(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    #[test]
    fn prompt_length_conditions_only_ttft_slos() {
        let validate = |yaml: &str| {
            let file: SloFile = serde_yaml::from_str(yaml).unwrap();
            SloSet::validate(None, None, None, file)
        };
        let set = validate(
            "slos:\n  - {name: t, objective: 99, ttft: 500ms, max_prompt_tokens: 4096, per_1k_prompt_tokens: 100ms}\n",
        )
        .unwrap();
        let prompt = set.slos[0].prompt;
        assert!(prompt.judges(Some(4096)) && !prompt.judges(Some(4097)) && prompt.judges(None));
        let base = Duration::from_millis(500);
        assert_eq!(prompt.threshold(base, Some(2500)), Duration::from_millis(750));
        assert_eq!(prompt.threshold(base, None), base, "unknown prompt: no allowance");
        let (key, message) =
            validate("slos:\n  - {name: t, objective: 99, tpot: 50ms, max_prompt_tokens: 10}\n").unwrap_err();
        assert_eq!(key, "slos[0].max_prompt_tokens");
        assert!(message.contains("ttft and answer_ttft SLOs only"), "{message}");
        let (key, _) =
            validate("slos:\n  - {name: t, objective: 99, e2e: 5s, per_1k_prompt_tokens: 1s}\n").unwrap_err();
        assert_eq!(key, "slos[0].per_1k_prompt_tokens");
        let (key, _) = validate("slos:\n  - {name: t, objective: 99, ttft: 1s, max_prompt_tokens: 0}\n").unwrap_err();
        assert_eq!(key, "slos[0].max_prompt_tokens");
    }

    #[test]
    fn an_objective_must_be_a_percentage_whose_budget_a_page_can_burn() {
        let entry = |objective: f64| SloEntry {
            answer_ttft: None,
            name: "s".into(),
            objective,
            ttft: Some(Duration::from_secs(1)),
            tpot: None,
            e2e: None,
            availability: false,
            max_prompt_tokens: None,
            per_1k_prompt_tokens: None,
            runbook_url: None,
        };
        let check = |objective: f64| {
            let file = SloFile {
                slos: vec![entry(objective)],
                goodput: None,
            };
            SloSet::validate(None, None, None, file)
                .map(|_| ())
                .map_err(|(_, message)| message)
        };
        assert!(check(0.99).unwrap_err().contains("did you mean 99?"));
        assert!(check(1.0).unwrap_err().contains("did you mean 100?"));
        // A low objective is an SLO like any other; `llmslo rules` leaves out the alert
        // branches it could never fire.
        assert!(check(90.0).is_ok());
        assert!(check(50.0).is_ok());
        assert!(check(93.1).is_ok());
        assert!(check(99.9).is_ok());
        assert!(check(100.0).unwrap_err().contains("below 100"));
    }

    use super::*;

    fn file(yaml: &str) -> SloFile {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn validate(yaml: &str) -> Result<SloSet, SpecError> {
        SloSet::validate(Some("chat".into()), None, None, file(yaml))
    }

    #[test]
    fn an_objective_may_be_written_with_its_percent_sign() {
        for written in ["99", "99.0", "\"99%\"", "\"99 %\"", "'99'"] {
            let set = validate(&format!("slos:\n  - {{name: t, objective: {written}, ttft: 1s}}\n")).unwrap();
            assert!((set.slos[0].objective - 0.99).abs() < 1e-12, "{written}");
        }
        let error = serde_yaml::from_str::<SloFile>("slos:\n  - {name: t, objective: lots, ttft: 1s}\n").unwrap_err();
        assert!(
            error
                .to_string()
                .contains("objective: invalid type: string \"lots\", expected a percentage like 99.9 or \"99.9%\""),
            "{error}"
        );
        // A ratio in a string is still caught for what it is.
        assert!(validate("slos:\n  - {name: t, objective: \"0.99\", ttft: 1s}\n")
            .unwrap_err()
            .1
            .contains("did you mean 99?"));
    }

    #[test]
    fn the_design_example_validates() {
        let set = validate(
            "slos:\n  - {name: ttft-500ms, objective: 99, ttft: 500ms}\n  - {name: tpot-50ms, objective: 99, tpot: 50ms}\n  \
             - {name: availability, objective: 99.9, availability: true}\ngoodput:\n  require: [ttft-500ms, tpot-50ms]\n",
        )
        .unwrap();
        assert_eq!(set.slos.len(), 3);
        assert_eq!(set.slos[0].kind, SloKind::Ttft(Duration::from_millis(500)));
        assert!((set.slos[2].objective - 0.999).abs() < 1e-12);
        assert_eq!(set.slos[2].error_budget(), 0.001);
        assert_eq!(set.slos[2].objective_percent(), 99.9);
        assert_eq!(set.goodput_require, [0, 1]);
        assert_eq!(set.period, DEFAULT_PERIOD);
        assert_eq!(set.min_events, 20);
        assert_eq!(
            set.thresholds(|k| if let SloKind::Tpot(d) = k { Some(d) } else { None }),
            [0.05]
        );
    }

    #[test]
    fn errors_name_the_key() {
        let key = |yaml: &str| validate(yaml).unwrap_err().0;
        assert_eq!(
            key("slos:\n  - {name: a, objective: 100, ttft: 1s}\n"),
            "slos[0].objective"
        );
        assert_eq!(
            key("slos:\n  - {name: a, objective: 0, ttft: 1s}\n"),
            "slos[0].objective"
        );
        assert_eq!(key("slos:\n  - {name: a, objective: 99}\n"), "slos[0].name");
        assert_eq!(
            key("slos:\n  - {name: a, objective: 99, ttft: 1s, tpot: 1s}\n"),
            "slos[0].name"
        );
        assert_eq!(key("slos:\n  - {name: a, objective: 99, tpot: 0s}\n"), "slos[0].tpot");
        assert_eq!(key("slos:\n  - {name: a b, objective: 99, tpot: 1s}\n"), "slos[0].name");
        assert_eq!(
            key("slos:\n  - {name: a, objective: 99, tpot: 1s}\n  - {name: a, objective: 9, e2e: 1s}\n"),
            "slos[1].name"
        );
        assert_eq!(
            key("slos:\n  - {name: a, objective: 99, tpot: 1s}\ngoodput: {require: [b]}\n"),
            "goodput.require[0]"
        );
        let short = SloSet::validate(None, Some(Duration::from_secs(60)), None, SloFile::default());
        assert_eq!(short.unwrap_err().0, "period");
    }
}
