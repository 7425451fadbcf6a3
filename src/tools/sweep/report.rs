//! The sweep's results: the knee, a table for the terminal and JSON for scripts.

use super::client::Endpoint;
use super::stats::{Judgement, Load, Quantiles, StepResult};
use crate::slo::spec::SloSet;
use serde_json::{json, Map, Value};

/// Everything one sweep measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's base URL.
    pub target: String,
    /// The model asked for.
    pub model: String,
    /// The route called.
    pub endpoint: Endpoint,
    /// The SLOs the steps were judged against.
    pub slos: SloSet,
    /// Every step, by load.
    pub steps: Vec<StepResult>,
    /// The highest load that met the SLOs, when one did.
    pub knee: Knee,
    /// The accelerators' price for an hour, when given: a million tokens are priced.
    pub gpu_hour_price: Option<f64>,
    /// The workload the requests followed, in a few lines, when not the fixed one.
    pub workload: Option<String>,
}

/// The knee: the highest measured load at which every deciding SLO held.
#[derive(Debug, Clone, PartialEq)]
pub struct Knee {
    /// That load, when any load met the SLOs.
    pub load: Option<Load>,
    /// Goodput there, requests per second.
    pub goodput_requests_per_second: f64,
    /// Goodput there, output tokens per second.
    pub goodput_output_tokens_per_second: f64,
    /// The SLO that failed first above it (or at the lowest load).
    pub limited_by: Option<String>,
    /// The search stopped at its highest load with the SLOs still met: the knee lies above.
    pub reached_max: bool,
    /// At the knee, the deciding SLOs too few requests judged: (name, events, events needed).
    pub unjudged: Vec<(String, u64, u64)>,
    /// The lowest load that missed, when one did.
    pub first_missed: Option<Load>,
    /// Where the worst deciding SLO's attainment crosses its objective, interpolated between
    /// the measured loads (finer than the search's steps); NaN when it does not cross.
    pub crossing: f64,
}

impl Knee {
    /// The knee of steps sorted by load: the highest load below the first that missed. A step
    /// too few requests judged does not end the search, and the knee says when it is one.
    pub fn from_steps(steps: &[StepResult], reached_max: bool) -> Self {
        let first_fail = steps.iter().position(|s| s.verdict() == Judgement::Missed);
        let passing = steps[..first_fail.unwrap_or(steps.len())].last();
        let limited_by = first_fail.and_then(|i| steps[i].limited_by()).map(str::to_string);
        Self {
            load: passing.map(|s| s.load),
            goodput_requests_per_second: passing.map_or(f64::NAN, |s| s.goodput_requests_per_second),
            goodput_output_tokens_per_second: passing.map_or(f64::NAN, |s| s.goodput_output_tokens_per_second),
            limited_by,
            reached_max,
            first_missed: first_fail.map(|i| steps[i].load),
            crossing: crossing(steps),
            unjudged: passing
                .map(|s| {
                    s.unjudged()
                        .iter()
                        .map(|a| (a.slo.clone(), a.valid, a.needed()))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        let line = self.describe_load();
        if self.crossing.is_finite() {
            let unit = self.load.map_or(" req/s", Load::unit);
            return format!("{line}; the objective is crossed at {:.2}{unit}", self.crossing);
        }
        line
    }

    fn describe_load(&self) -> String {
        match (self.load, &self.limited_by) {
            (None, Some(slo)) => format!("no load met the SLOs: `{slo}` fails even at the lowest load"),
            (None, None) => "no load met the SLOs".to_string(),
            (Some(load), limited_by) => {
                let limit = match (limited_by, self.reached_max, self.first_missed) {
                    (_, true, _) => " (the highest load tried: the knee is above it)".to_string(),
                    (Some(slo), _, _) => format!(", limited by `{slo}`"),
                    (None, _, Some(missed)) => format!(", every request failed at {missed}"),
                    (None, _, None) => " (the SLOs held at every load measured)".to_string(),
                };
                let unjudged: Vec<String> = self
                    .unjudged
                    .iter()
                    .map(|(slo, events, needed)| format!("`{slo}` had {events} of the {needed} requests it needs"))
                    .collect();
                let caveat = if unjudged.is_empty() {
                    String::new()
                } else {
                    format!("; unjudged there: {} (lengthen --duration)", unjudged.join(", "))
                };
                format!(
                    "knee: {load}, goodput {:.2} req/s, {:.0} output tokens/s{limit}{caveat}",
                    self.goodput_requests_per_second, self.goodput_output_tokens_per_second
                )
            }
        }
    }
}

/// The load where the smallest margin of a deciding SLO (attainment − objective) first falls
/// below zero, interpolated between the steps (sorted by load) around it.
fn crossing(steps: &[StepResult]) -> f64 {
    let loads: Vec<f64> = steps.iter().map(|s| s.load.value()).collect();
    let margins: Vec<f64> = steps
        .iter()
        .map(|s| {
            s.attainment
                .iter()
                .filter(|a| a.required)
                .map(|a| a.attainment - a.objective)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    super::verdict::interpolated_knee(&loads, &margins)
}

/// A step in one line, for its progress bar and logs.
pub fn step_line(step: &StepResult) -> String {
    format!(
        "{}: {} requests, {} failed, TTFT p99 {}, TPOT p99 {}, {:.0} tok/s, {} SLOs",
        step.load,
        step.requests,
        step.failed(),
        ms(step.ttft.p99),
        ms(step.tpot.p99),
        step.output_tokens_per_second,
        step.verdict().as_str(),
    )
}

impl Report {
    /// What a million output tokens cost at `step`: an hour of the accelerators over the
    /// tokens it serves in an hour, input tokens weighing `cost.input_token_weight` of an
    /// output token (the sidecar's own formula).
    pub fn cost_per_million_output_tokens(&self, step: &StepResult) -> Option<f64> {
        let price = self.gpu_hour_price?;
        let input = step.prompt_tokens_mean * step.requests_per_second;
        let input = if input.is_finite() { input } else { 0.0 };
        let weighted = step.output_tokens_per_second + self.slos.input_token_weight * input;
        Some(if weighted > 0.0 {
            price / 3600.0 * 1e6 / weighted
        } else {
            f64::NAN
        })
    }

    /// The table printed at the end.
    pub fn render(&self) -> String {
        let slo_names: Vec<&str> = self.slos.slos.iter().map(|s| s.name.as_str()).collect();
        let mut header = vec![
            "load",
            "requests",
            "failed",
            "TTFT p50",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "ITL p99",
            "tok/s",
            "tok/s/user",
            "goodput req/s",
        ];
        if self.gpu_hour_price.is_some() {
            header.push("cost/1M out");
        }
        header.extend(&slo_names);
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for step in &self.steps {
            let knee = if Some(step.load) == self.knee.load {
                " ◀ knee"
            } else {
                ""
            };
            let mut row = vec![
                format!("{}{knee}", step.load),
                step.requests.to_string(),
                step.failed().to_string(),
                ms(step.ttft.p50),
                ms(step.ttft.p99),
                ms(step.tpot.p50),
                ms(step.tpot.p99),
                ms(step.itl.p99),
                format!("{:.0}", step.output_tokens_per_second),
                format!("{:.1}", step.per_user_tokens_per_second),
                format!("{:.2}", step.goodput_requests_per_second),
            ];
            if let Some(cost) = self.cost_per_million_output_tokens(step) {
                row.push(format!("{cost:.2}"));
            }
            for a in &step.attainment {
                let mark = match (a.required, a.verdict()) {
                    (false, _) => "",
                    (true, Judgement::Met) => " ✓",
                    (true, Judgement::Missed) => " ✗",
                    (true, Judgement::Unjudged) => " ?",
                };
                row.push(format!("{}{mark}", percent(a.attainment)));
            }
            rows.push(row);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = format!(
            "{} at {} ({} endpoint), SLO attainment per step (✓ met, ✗ missed, ? too few requests to judge: decides the knee)\n\n",
            self.model,
            self.target,
            self.endpoint.api()
        );
        for row in rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (cell, w))| {
                    let pad = w - cell.chars().count();
                    if i == 0 {
                        format!("{cell}{}", " ".repeat(pad))
                    } else {
                        format!("{}{cell}", " ".repeat(pad))
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        for step in &self.steps {
            if let Some(note) = step.note() {
                out.push_str(&format!("\n{}: {note}", step.load));
            }
        }
        out.push('\n');
        out.push_str(&self.knee.describe());
        if let Some(cost) = self
            .knee_step()
            .and_then(|step| self.cost_per_million_output_tokens(step))
        {
            out.push_str(&format!("; a million output tokens cost {cost:.2} there"));
        }
        out.push('\n');
        out
    }

    /// The unit of the loads, for people (` clients` or ` req/s`).
    pub fn load_unit(&self) -> &'static str {
        self.steps.first().map_or(" req/s", |s| s.load.unit())
    }

    /// The step at the knee, when there is one.
    fn knee_step(&self) -> Option<&StepResult> {
        self.steps.iter().find(|s| Some(s.load) == self.knee.load)
    }

    /// Whether no step served a single request: nothing was measured.
    pub fn measured_nothing(&self) -> bool {
        self.steps.iter().all(|s| s.requests == s.failed())
    }

    /// The JSON document `--json` writes.
    pub fn to_json(&self) -> Value {
        let load_field = |load: Load| match load {
            Load::Concurrency(c) => ("concurrency", json!(c)),
            Load::Rate(r) => ("rate", json!(r)),
        };
        let mut knee = Map::new();
        if let Some(load) = self.knee.load {
            let (key, value) = load_field(load);
            knee.insert(key.into(), value);
        }
        knee.insert(
            "goodput_requests_per_second".into(),
            number(self.knee.goodput_requests_per_second),
        );
        knee.insert(
            "goodput_output_tokens_per_second".into(),
            number(self.knee.goodput_output_tokens_per_second),
        );
        if let Some(cost) = self
            .knee_step()
            .and_then(|step| self.cost_per_million_output_tokens(step))
        {
            knee.insert("cost_per_million_output_tokens".into(), number(cost));
        }
        knee.insert("limited_by".into(), json!(self.knee.limited_by));
        knee.insert("reached_max".into(), json!(self.knee.reached_max));
        knee.insert("crossing".into(), number(self.knee.crossing));
        let steps: Vec<Value> = self
            .steps
            .iter()
            .map(|step| {
                let mut s = Map::new();
                let (key, value) = load_field(step.load);
                s.insert(key.into(), value);
                s.insert("window_s".into(), number(step.window_s));
                s.insert("requests".into(), json!(step.requests));
                s.insert("failed".into(), json!(step.failed()));
                s.insert("errors".into(), json!(step.errors));
                for (name, q) in [
                    ("ttft", step.ttft),
                    ("ttfb", step.ttfb),
                    ("tpot", step.tpot),
                    ("itl", step.itl),
                    ("e2e", step.e2e),
                ] {
                    insert_quantiles(&mut s, name, q);
                }
                s.insert("prompt_tokens_mean".into(), number(step.prompt_tokens_mean));
                s.insert("output_tokens_mean".into(), number(step.output_tokens_mean));
                s.insert("requests_per_second".into(), number(step.requests_per_second));
                s.insert("output_tokens_per_second".into(), number(step.output_tokens_per_second));
                if let Some(cost) = self.cost_per_million_output_tokens(step) {
                    s.insert("cost_per_million_output_tokens".into(), number(cost));
                }
                s.insert(
                    "per_user_output_tokens_per_second".into(),
                    number(step.per_user_tokens_per_second),
                );
                s.insert(
                    "goodput_requests_per_second".into(),
                    number(step.goodput_requests_per_second),
                );
                s.insert(
                    "goodput_output_tokens_per_second".into(),
                    number(step.goodput_output_tokens_per_second),
                );
                let attainment: Map<String, Value> = step
                    .attainment
                    .iter()
                    .map(|a| (a.slo.clone(), number(a.attainment)))
                    .collect();
                s.insert("attainment".into(), Value::Object(attainment));
                let verdicts: Map<String, Value> = step
                    .attainment
                    .iter()
                    .map(|a| {
                        (
                            a.slo.clone(),
                            json!({"verdict": a.verdict(), "events": a.valid, "needed": a.needed()}),
                        )
                    })
                    .collect();
                s.insert("verdicts".into(), Value::Object(verdicts));
                s.insert("verdict".into(), json!(step.verdict()));
                s.insert("meets_slos".into(), json!(step.verdict() == Judgement::Met));
                if let Some(note) = step.note() {
                    s.insert("note".into(), json!(note));
                }
                if !step.error_examples.is_empty() {
                    s.insert("error_examples".into(), json!(step.error_examples));
                }
                Value::Object(s)
            })
            .collect();
        let slos: Vec<Value> = self
            .slos
            .slos
            .iter()
            .enumerate()
            .map(|(i, slo)| {
                json!({
                    "name": slo.name,
                    "objective": slo.objective,
                    "required": self.slos.decides_goodput(i),
                })
            })
            .collect();
        let mut document = json!({
            "target": self.target,
            "model": self.model,
            "endpoint": self.endpoint.api(),
            "slos": slos,
            "knee": Value::Object(knee),
            "steps": steps,
        });
        if let Some(workload) = &self.workload {
            document["workload"] = json!(workload);
        }
        if let Some(price) = self.gpu_hour_price {
            document["gpu_hour_price"] = number(price);
        }
        document
    }
}

fn insert_quantiles(map: &mut Map<String, Value>, name: &str, q: Quantiles) {
    map.insert(format!("{name}_mean_s"), number(q.mean));
    map.insert(format!("{name}_p50_s"), number(q.p50));
    map.insert(format!("{name}_p90_s"), number(q.p90));
    map.insert(format!("{name}_p99_s"), number(q.p99));
}

/// A JSON number, or null for NaN (JSON has no NaN).
pub(super) fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// Seconds as milliseconds for the table (`-` when unknown).
fn ms(seconds: f64) -> String {
    if seconds.is_nan() {
        "-".into()
    } else {
        format!("{:.1} ms", seconds * 1e3)
    }
}

fn percent(fraction: f64) -> String {
    if fraction.is_nan() {
        "-".into()
    } else {
        format!("{:.1}%", fraction * 100.0)
    }
}
