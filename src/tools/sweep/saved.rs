//! `llmslo sweep --compare A.json B.json`: two saved sweeps (`--json` files) read back as the
//! reports they were, checked to have been judged against the same SLOs and workload, and
//! shown on one report and one plot. Saved sweeps ran at different times with no repetitions,
//! so their difference is shown, not tested: only a live comparison gives a verdict.

use super::asked::{bounded, Asked};
use super::client::Endpoint;
use super::health::ClientHealth;
use super::report::{self, Knee, Report};
use super::stats::{Attainment, Load, Quantiles, StepResult};
use super::SweepError;
use crate::record::Outcome;
use crate::slo::spec::SloSet;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Two saved sweeps side by side.
#[derive(Debug, Clone)]
pub struct SavedComparison {
    /// A's curve, as saved.
    pub a: Report,
    /// B's curve.
    pub b: Report,
}

impl SavedComparison {
    /// Reads both files, judged against `slos` (the config's, which both must have used), and
    /// checks they measured the same workload with the same kind of load.
    pub fn read(a: &Path, b: &Path, slos: &SloSet) -> Result<Self, SweepError> {
        let a = read_report(a, slos)?;
        let b = read_report(b, slos)?;
        let usage = |m: String| Err(SweepError::Usage(m));
        if let Some(difference) = a.asked.difference(&b.asked) {
            return usage(format!(
                "the two results asked for different requests, so their curves do not compare: {difference}"
            ));
        }
        if a.endpoint != b.endpoint || a.workload != b.workload {
            return usage(format!(
                "the two results ran different workloads, so their curves do not compare: A ran {}, B ran {}",
                workload(&a),
                workload(&b)
            ));
        }
        let kind = |r: &Report| r.steps.first().map(|s| matches!(s.load, Load::Rate(_)));
        if kind(&a) != kind(&b) {
            return usage(
                "one result held concurrency (closed loop), the other rates (open loop): their loads do not compare"
                    .into(),
            );
        }
        Ok(Self { a, b })
    }

    /// Both tables, then the knees and their difference, for the terminal.
    pub fn render(&self) -> String {
        let mut out = format!("A: {}", self.a.render());
        out.push_str(&format!("\nB: {}", self.b.render()));
        let unit = self.a.load_unit();
        let (a, b) = (knee_load(&self.a.knee), knee_load(&self.b.knee));
        out.push('\n');
        if a.is_finite() && b.is_finite() {
            out.push_str(&format!(
                "knee: A {a:.2}{unit}, B {b:.2}{unit}; B − A {:+.2}{unit} ({:+.1} %)\n",
                b - a,
                (b / a - 1.0) * 100.0
            ));
        } else {
            let shown = |knee: f64| {
                if knee.is_finite() {
                    format!("{knee:.2}{unit}")
                } else {
                    "not reached".to_string()
                }
            };
            out.push_str(&format!(
                "knee: A {}, B {}; a knee not reached on both curves is not compared\n",
                shown(a),
                shown(b)
            ));
        }
        out.push_str(
            "no verdict: saved results were measured apart, once each, so what changed between the runs counts \
             in the difference and its noise is unknown. `--compare URL_A URL_B` measures both with the same \
             requests, interleaved and repeated, and tests the difference.\n",
        );
        out
    }

    /// The JSON document `--json` writes.
    pub fn to_json(&self) -> Value {
        let (a, b) = (knee_load(&self.a.knee), knee_load(&self.b.knee));
        let difference = b - a;
        json!({
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "knee": {
                "a": report::number(a),
                "b": report::number(b),
                "difference": report::number(difference),
            },
            "verdict": Value::Null,
        })
    }
}

/// The knee's load when it was reached: where the objective is crossed, when it is, else
/// the highest load met below the first missed (NaN: not reached).
fn knee_load(knee: &Knee) -> f64 {
    if knee.crossing.is_finite() {
        return knee.crossing;
    }
    knee.reached_load().map_or(f64::NAN, Load::value)
}

fn workload(report: &Report) -> String {
    let endpoint = report.endpoint.api();
    match &report.workload {
        Some(workload) => format!("`{}` on {endpoint}", workload.trim().replace('\n', "; ")),
        None => format!("the fixed workload on {endpoint}"),
    }
}

/// Largest saved sweep read: what `--json` writes is tens of kilobytes.
pub const MAX_SAVED_BYTES: u64 = 4 << 20;

/// Reads one saved sweep as the report it was, its SLOs checked against `slos`.
pub fn read_report(path: &Path, slos: &SloSet) -> Result<Report, SweepError> {
    let name = path.display().to_string();
    let text =
        crate::flags::read_bounded(path, MAX_SAVED_BYTES).map_err(|e| SweepError::Usage(format!("{name}: {e}")))?;
    let document: Value = serde_json::from_str(&text)
        .map_err(|e| SweepError::Usage(format!("{name}: not the JSON `llmslo sweep --json` writes: {e}")))?;
    report_from_json(&document, slos).map_err(|e| SweepError::Usage(format!("{name}: {e}")))
}

/// A sweep's `--json` document back into its report; errors name the field.
fn report_from_json(document: &Value, slos: &SloSet) -> Result<Report, String> {
    if !document.is_object() {
        return Err("not the JSON `llmslo sweep --json` writes: expected an object".into());
    }
    if document.get("verdict").is_some() {
        return Err("a comparison's result: give two sweeps' results".into());
    }
    check_slos(document, slos)?;
    let endpoint = text(document, "endpoint")?;
    let endpoint = Endpoint::from_api(&endpoint)
        .ok_or_else(|| format!("`endpoint`: `{}` is not one llmslo calls", bounded(&endpoint)))?;
    let steps_json = document
        .get("steps")
        .and_then(Value::as_array)
        .ok_or("`steps`: expected a list")?;
    let mut steps = Vec::with_capacity(steps_json.len());
    for (i, step) in steps_json.iter().enumerate() {
        steps.push(step_from_json(step, slos).map_err(|e| format!("`steps[{i}]`.{e}"))?);
    }
    if steps.is_empty() {
        return Err("`steps`: no step was measured".into());
    }
    let rate = |s: &StepResult| matches!(s.load, Load::Rate(_));
    if steps.iter().any(|s| rate(s) != rate(&steps[0])) {
        return Err("`steps`: mixes rates and concurrencies".into());
    }
    let reached_max = document
        .pointer("/knee/reached_max")
        .and_then(Value::as_bool)
        .ok_or("`knee.reached_max`: expected true or false")?;
    let gpu_hour_price = match document.get("gpu_hour_price") {
        None | Some(Value::Null) => None,
        Some(price) => Some(
            price
                .as_f64()
                .filter(|p| p.is_finite() && *p > 0.0)
                .ok_or("`gpu_hour_price`: expected a price above zero")?,
        ),
    };
    let workload = match document.get("workload") {
        None | Some(Value::Null) => None,
        Some(_) => Some(text(document, "workload")?),
    };
    let asked = match document.get("asked") {
        Some(Value::Object(asked)) => Asked(asked.clone()),
        Some(_) => return Err("`asked`: expected an object".into()),
        None => {
            return Err(
                "`asked`: missing: saved by an earlier llmslo, which did not record the requests it asked for \
                 (lengths, loads, arrivals); measure again to compare"
                    .into(),
            )
        }
    };
    Ok(Report {
        target: text(document, "target")?,
        model: text(document, "model")?,
        endpoint,
        slos: slos.clone(),
        knee: Knee::from_steps(&steps, reached_max),
        steps,
        gpu_hour_price,
        workload,
        asked,
    })
}

/// The saved SLOs must be the config's: same names, objectives and deciding ones, in order.
fn check_slos(document: &Value, slos: &SloSet) -> Result<(), String> {
    let saved = document
        .get("slos")
        .and_then(Value::as_array)
        .ok_or("`slos`: expected a list")?;
    let describe = |name: &str, objective: f64, required: bool| {
        format!(
            "{} at {}{}",
            bounded(name),
            objective,
            if required { "" } else { " (not deciding)" }
        )
    };
    let ours: Vec<String> = slos
        .slos
        .iter()
        .enumerate()
        .map(|(i, slo)| describe(&slo.name, slo.objective, slos.decides_goodput(i)))
        .collect();
    let theirs: Vec<String> = saved
        .iter()
        .map(|slo| {
            let name = slo.get("name").and_then(Value::as_str).unwrap_or("?");
            let objective = slo.get("objective").and_then(Value::as_f64).unwrap_or(f64::NAN);
            let required = slo.get("required").and_then(Value::as_bool).unwrap_or(false);
            describe(name, objective, required)
        })
        .collect();
    if ours != theirs {
        return Err(format!(
            "judged against other SLOs ({}) than --config's ({}): compare results judged against the same SLOs",
            theirs.join(", "),
            ours.join(", ")
        ));
    }
    Ok(())
}

/// One step of the saved `steps` list.
fn step_from_json(step: &Value, slos: &SloSet) -> Result<StepResult, String> {
    let load = match (step.get("rate"), step.get("concurrency")) {
        (Some(rate), None) => Load::Rate(
            rate.as_f64()
                .filter(|r| r.is_finite() && *r > 0.0)
                .ok_or("rate: expected requests per second above zero")?,
        ),
        (None, Some(clients)) => Load::Concurrency(
            clients
                .as_u64()
                .filter(|c| *c > 0)
                .ok_or("concurrency: expected a client count above zero")? as usize,
        ),
        _ => return Err("rate or concurrency: expected one of them".into()),
    };
    let mut errors = BTreeMap::new();
    for (outcome, count) in step
        .get("errors")
        .and_then(Value::as_object)
        .ok_or("errors: expected an object")?
    {
        let known = Outcome::ALL
            .iter()
            .find(|o| o.as_str() == outcome)
            .ok_or_else(|| format!("errors: `{}` is not an outcome", bounded(outcome)))?;
        let count = count.as_u64().ok_or("errors: expected counts")?;
        errors.insert(known.as_str(), count);
    }
    let mut error_examples = BTreeMap::new();
    if let Some(examples) = step.get("error_examples").and_then(Value::as_object) {
        for (outcome, message) in examples {
            if let (Some(known), Some(message)) = (errors.keys().find(|o| **o == outcome), message.as_str()) {
                error_examples.insert(*known, bounded(message));
            }
        }
    }
    let requests = count(step, "requests")?;
    if errors.values().sum::<u64>() > requests {
        return Err("errors: more failures than requests".into());
    }
    let quantiles = |name: &str| -> Result<Quantiles, String> {
        Ok(Quantiles {
            mean: number(step, &format!("{name}_mean_s"))?,
            p50: number(step, &format!("{name}_p50_s"))?,
            p90: number(step, &format!("{name}_p90_s"))?,
            p99: number(step, &format!("{name}_p99_s"))?,
        })
    };
    let mut attainment = Vec::with_capacity(slos.slos.len());
    for (i, slo) in slos.slos.iter().enumerate() {
        let name = bounded(&slo.name);
        let fraction = step
            .get("attainment")
            .and_then(|a| a.get(slo.name.as_str()))
            .ok_or_else(|| format!("attainment.{name}: missing"))
            .and_then(|v| nullable(v).ok_or_else(|| format!("attainment.{name}: expected a fraction")))?;
        let valid = step
            .get("verdicts")
            .and_then(|v| v.get(slo.name.as_str()))
            .and_then(|v| v.get("events"))
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("verdicts.{name}.events: expected a count"))?;
        let good = if valid == 0 {
            0
        } else if (0.0..=1.0).contains(&fraction) {
            (fraction * valid as f64).round() as u64
        } else {
            return Err(format!("attainment.{name}: expected a fraction from 0 to 1"));
        };
        attainment.push(Attainment {
            slo: slo.name.to_string(),
            objective: slo.objective,
            valid,
            good,
            attainment: fraction,
            required: slos.decides_goodput(i),
        });
    }
    let (client, lag_bound_s) = match step.get("client") {
        None | Some(Value::Null) => (None, crate::tools::sweep::health::lag_bound(slos)),
        Some(client) => client_from_json(client).map_err(|e| format!("client.{e}"))?,
    };
    Ok(StepResult {
        load,
        window_s: number(step, "window_s")?,
        requests,
        errors,
        error_examples,
        ttft: quantiles("ttft")?,
        ttfb: quantiles("ttfb")?,
        tpot: quantiles("tpot")?,
        itl: quantiles("itl")?,
        e2e: quantiles("e2e")?,
        prompt_tokens_mean: number(step, "prompt_tokens_mean")?,
        output_tokens_mean: number(step, "output_tokens_mean")?,
        ended_early: ended_early(step).map_err(|e| format!("ended_early.{e}"))?,
        requests_per_second: number(step, "requests_per_second")?,
        output_tokens_per_second: number(step, "output_tokens_per_second")?,
        per_user_tokens_per_second: number(step, "per_user_output_tokens_per_second")?,
        goodput_requests_per_second: number(step, "goodput_requests_per_second")?,
        goodput_output_tokens_per_second: number(step, "goodput_output_tokens_per_second")?,
        attainment,
        client,
        lag_bound_s,
    })
}

/// A step's requests that ended before the output length they asked, by API (none in files
/// from before they were counted).
fn ended_early(step: &Value) -> Result<BTreeMap<&'static str, (u64, u64)>, String> {
    let Some(apis) = step.get("ended_early").and_then(Value::as_object) else {
        return Ok(BTreeMap::new());
    };
    apis.iter()
        .map(|(api, counts)| {
            let name = Endpoint::from_api(api)
                .ok_or_else(|| format!("{}: not an API", bounded(api)))?
                .api();
            let count = |field: &str| {
                counts
                    .get(field)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| format!("{name}.{field}: expected a count"))
            };
            Ok((name, (count("ended_early")?, count("served")?)))
        })
        .collect()
}

/// A step's saved client health and the lag bound it was judged by.
fn client_from_json(client: &Value) -> Result<(Option<ClientHealth>, f64), String> {
    let cores = client
        .get("cores")
        .and_then(Value::as_u64)
        .filter(|c| (1..=1 << 16).contains(c))
        .ok_or("cores: expected a count of cores")?;
    let health = ClientHealth {
        wake_lag_p99_s: number(client, "wake_lag_p99_s")?,
        wake_lag_max_s: number(client, "wake_lag_max_s")?,
        send_lag_p99_s: number(client, "send_lag_p99_s")?,
        client_cpu_cores: number(client, "client_cpu_cores")?,
        host_busy: number(client, "host_busy")?,
        host_steal: number(client, "host_steal")?,
        cores: cores as usize,
    };
    let bound = number(client, "lag_bound_s")?;
    if !(bound.is_finite() && bound > 0.0) {
        return Err("lag_bound_s: expected seconds above zero".into());
    }
    Ok((Some(health), bound))
}

/// A number field; null (what NaN is written as) reads as NaN.
fn number(object: &Value, key: &str) -> Result<f64, String> {
    object
        .get(key)
        .and_then(nullable)
        .ok_or_else(|| format!("{key}: expected a number"))
}

fn nullable(value: &Value) -> Option<f64> {
    match value {
        Value::Null => Some(f64::NAN),
        value => value.as_f64(),
    }
}

fn count(object: &Value, key: &str) -> Result<u64, String> {
    object
        .get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("{key}: expected a count"))
}

fn text(object: &Value, key: &str) -> Result<String, String> {
    object
        .get(key)
        .and_then(Value::as_str)
        .map(bounded)
        .ok_or_else(|| format!("`{key}`: expected text"))
}

#[cfg(test)]
mod tests;
