//! The sweep's results: the knee, a table for the terminal and JSON for scripts.

use super::asked::Asked;
use super::client::Endpoint;
use super::stats::{Judgement, Load, Quantiles, StepResult};
use crate::slo::spec::SloSet;
use serde_json::{json, Map, Value};

mod notes;

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
    /// What the sweep was asked to send.
    pub asked: Asked,
}

/// The knee: the highest measured load at which every deciding SLO held, below the lowest
/// that missed them. One rule decides what the report says: a load is held below the first
/// missed step, the objective is crossed between the knee and that step, and without a
/// missed step the knee is not reached.
#[derive(Debug, Clone, PartialEq)]
pub struct Knee {
    /// The highest load below the first missed step (the highest measured when none missed),
    /// when any load held.
    pub load: Option<Load>,
    /// Goodput there, requests per second.
    pub goodput_requests_per_second: f64,
    /// Goodput there, output tokens per second.
    pub goodput_output_tokens_per_second: f64,
    /// The SLO that failed first above it (or at the lowest load).
    pub limited_by: Option<String>,
    /// The search stopped at its highest load with the SLOs still met: the knee lies above.
    pub reached_max: bool,
    /// At the knee, the deciding SLOs too few requests judged: (name, events, events needed,
    /// attainment, objective).
    pub unjudged: Vec<Unjudged>,
    /// The lowest load that missed, when one did.
    pub first_missed: Option<Load>,
    /// Where the worst deciding SLO's attainment crosses its objective, interpolated between
    /// the knee and the first missed load; NaN when the knee is not reached or its own
    /// attainment is already below the objective.
    pub crossing: f64,
    /// The first step above the knee whose client fell behind while the SLOs missed: no knee
    /// is named, the client was the limit.
    pub client_limited: Option<ClientLimit>,
}

/// A deciding SLO at the knee that had too few requests to be judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Unjudged {
    /// Its name.
    pub slo: String,
    /// Requests it judged.
    pub events: u64,
    /// Requests it needs.
    pub needed: u64,
    /// Its attainment there.
    pub attainment: f64,
    /// Its objective.
    pub objective: f64,
}

/// Where the client, not the engine, was the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientLimit {
    /// The load.
    pub load: Load,
    /// How the client fared there, for people.
    pub health: String,
    /// The lag bound it passed, seconds.
    pub bound_s: f64,
}

impl Knee {
    /// The knee of steps sorted by load: the highest load below the first that missed. A step
    /// too few requests judged does not end the search, and the knee says when it is one; a
    /// step the client could not judge ends it, and no knee is named.
    pub fn from_steps(steps: &[StepResult], reached_max: bool) -> Self {
        let stop = steps
            .iter()
            .position(|s| matches!(s.verdict(), Judgement::Missed | Judgement::ClientLimited));
        let client_limited = stop
            .map(|i| &steps[i])
            .filter(|s| s.verdict() == Judgement::ClientLimited)
            .map(|s| ClientLimit {
                load: s.load,
                health: s.client.map(|c| c.describe()).unwrap_or_default(),
                bound_s: s.lag_bound_s,
            });
        let first_fail = stop.filter(|_| client_limited.is_none());
        let below = stop.unwrap_or(steps.len());
        let passing = steps[..below].last();
        let limited_by = first_fail.and_then(|i| steps[i].limited_by()).map(str::to_string);
        let crossing = match (below.checked_sub(1), first_fail) {
            (Some(knee), Some(missed)) => crossing(&steps[knee..=missed]),
            _ => f64::NAN,
        };
        Self {
            load: passing.map(|s| s.load),
            goodput_requests_per_second: passing.map_or(f64::NAN, |s| s.goodput_requests_per_second),
            goodput_output_tokens_per_second: passing.map_or(f64::NAN, |s| s.goodput_output_tokens_per_second),
            limited_by,
            reached_max,
            first_missed: first_fail.map(|i| steps[i].load),
            crossing,
            client_limited,
            unjudged: passing
                .map(|s| {
                    s.unjudged()
                        .iter()
                        .map(|a| Unjudged {
                            slo: a.slo.clone(),
                            events: a.valid,
                            needed: a.needed(),
                            attainment: a.attainment,
                            objective: a.objective,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Whether the knee was found: a load held and the next one up missed, by the engine.
    pub fn reached(&self) -> bool {
        self.load.is_some() && self.first_missed.is_some()
    }

    /// The knee's load when reached.
    pub fn reached_load(&self) -> Option<Load> {
        self.load.filter(|_| self.reached())
    }

    /// One line for people; `more` says how to get more requests per step (`lengthen
    /// --duration`, `replay a longer trace`).
    pub fn describe(&self, more: &str) -> String {
        let line = self.describe_load(more);
        if self.crossing.is_finite() {
            let unit = self.load.map_or(" req/s", Load::unit);
            return format!("{line}; the objective is crossed at {:.2}{unit}", self.crossing);
        }
        line
    }

    fn describe_load(&self, more: &str) -> String {
        let goodput = |load: Load| {
            format!(
                "{load}, goodput {:.2} req/s, {:.0} output tokens/s",
                self.goodput_requests_per_second, self.goodput_output_tokens_per_second
            )
        };
        let caveat = self.unjudged_caveat(more);
        if let Some(limit) = &self.client_limited {
            let held = match self.load {
                Some(load) => format!("the SLOs held up to {load}"),
                None => "no lower load held the SLOs".to_string(),
            };
            return format!(
                "no knee named: the client, not the engine, was the limit at {} ({}; bound {:.1} ms); {held}. \
                 Measure from a host with CPU to spare",
                limit.load,
                limit.health,
                limit.bound_s * 1e3
            );
        }
        match (self.load, &self.limited_by) {
            (None, Some(slo)) => format!("no load met the SLOs: `{slo}` fails even at the lowest load"),
            (None, None) => "no load met the SLOs".to_string(),
            (Some(load), _) if !self.reached() => {
                let why = if self.reached_max {
                    "the highest load the search may try"
                } else {
                    "the highest load measured"
                };
                // Held only where judged: an unjudged step missed nothing, and met nothing.
                let held = if self.unjudged.is_empty() {
                    "the SLOs held"
                } else {
                    "no load missed the SLOs"
                };
                format!("knee not reached: {held} up to {} ({why}){caveat}", goodput(load))
            }
            (Some(load), limited_by) => {
                let limit = match (limited_by, self.first_missed) {
                    (Some(slo), _) => format!(", limited by `{slo}`"),
                    (None, Some(missed)) => format!(", every request failed at {missed}"),
                    (None, None) => String::new(),
                };
                format!("knee: {}{limit}{caveat}", goodput(load))
            }
        }
    }

    /// What the knee's step could not judge, and its attainment where below the objective.
    fn unjudged_caveat(&self, more: &str) -> String {
        if self.unjudged.is_empty() {
            return String::new();
        }
        let unjudged: Vec<String> = self
            .unjudged
            .iter()
            .map(|u| {
                let below = if u.attainment < u.objective {
                    format!(
                        ", and stood at {:.1} % under its {:.1} % objective",
                        u.attainment * 100.0,
                        u.objective * 100.0
                    )
                } else {
                    String::new()
                };
                format!(
                    "`{}` had {} of the {} requests it needs{below}",
                    u.slo, u.events, u.needed
                )
            })
            .collect();
        format!("; unjudged there: {} ({more})", unjudged.join(", "))
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
        let open_loop = matches!(self.steps.first().map(|s| s.load), Some(Load::Rate(_)));
        if open_loop {
            header.insert(1, "sent req/s");
        }
        if self.gpu_hour_price.is_some() {
            header.push("cost/1M out");
        }
        header.push("client lag p99");
        header.extend(&slo_names);
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for step in &self.steps {
            let knee = if Some(step.load) == self.knee.reached_load() {
                " ◀ knee"
            } else if step.verdict() == Judgement::ClientLimited {
                " ◀ client-limited"
            } else {
                ""
            };
            let mut row = vec![format!("{}{knee}", step.load)];
            if open_loop {
                row.push(format!("{:.2}", step.requests as f64 / step.window_s));
            }
            row.extend([
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
            ]);
            if let Some(cost) = self.cost_per_million_output_tokens(step) {
                row.push(format!("{cost:.2}"));
            }
            row.push(match step.client {
                Some(client) if step.client_behind() => format!("⚠ {}", ms(client.lag_p99_s())),
                Some(client) => ms(client.lag_p99_s()),
                None => "-".into(),
            });
            for a in &step.attainment {
                let mark = match (a.required, a.verdict()) {
                    (false, _) => "",
                    (true, Judgement::Met) => " ✓",
                    (true, Judgement::Missed | Judgement::ClientLimited) => " ✗",
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
        out.push_str(&self.footnotes());
        out.push('\n');
        out.push_str(&self.knee.describe(self.asked.more_requests()));
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

    /// The step at the knee, when it was reached.
    fn knee_step(&self) -> Option<&StepResult> {
        self.steps.iter().find(|s| Some(s.load) == self.knee.reached_load())
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
        knee.insert("reached".into(), json!(self.knee.reached()));
        match (self.knee.reached_load(), self.knee.load) {
            (Some(load), _) => {
                let (key, value) = load_field(load);
                knee.insert(key.into(), value);
            }
            (None, Some(held)) => {
                let (key, value) = load_field(held);
                knee.insert("held_up_to".into(), json!({ key: value }));
            }
            (None, None) => {}
        }
        if let Some(limit) = &self.knee.client_limited {
            let (key, value) = load_field(limit.load);
            knee.insert("client_limited".into(), json!({ key: value, "health": limit.health }));
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
                if let Load::Rate(_) = step.load {
                    // The rate asked is offered; random arrivals send more or fewer.
                    s.insert("sent_rate".into(), number(step.requests as f64 / step.window_s));
                }
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
                s.insert(
                    "ended_early".into(),
                    step.ended_early
                        .iter()
                        .map(|(api, (early, served))| {
                            (api.to_string(), json!({"ended_early": early, "served": served}))
                        })
                        .collect::<Map<String, Value>>()
                        .into(),
                );
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
                if let Some(client) = step.client {
                    s.insert(
                        "client".into(),
                        json!({
                            "wake_lag_p99_s": number(client.wake_lag_p99_s),
                            "wake_lag_max_s": number(client.wake_lag_max_s),
                            "send_lag_p99_s": number(client.send_lag_p99_s),
                            "client_cpu_cores": number(client.client_cpu_cores),
                            "host_busy": number(client.host_busy),
                            "host_steal": number(client.host_steal),
                            "cores": client.cores,
                            "lag_bound_s": number(step.lag_bound_s),
                            "behind": step.client_behind(),
                            "gap_stray": number(step.gap_stray()),
                        }),
                    );
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
            "asked": Value::Object(self.asked.0.clone()),
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
