//! `llmslo sweep --compare A B`: two targets measured at the same loads with the same
//! requests, interleaved (at each load A then B, then B then A at the next repetition, so
//! that drift falls on both), each one's curve and knee, and a verdict on the difference that
//! knows its noise ([`super::verdict`]).

use super::client::Sample;
use super::health::ClientHealth;
use super::load::Bodies;
use super::report::{number, Knee, Report};
use super::stats::{Load, StepResult};
use super::verdict::{self, Judging, Observation, Run, Verdict, MAX_SLOS};
use super::{check_slos, connect, describe_workload, hold, judge_step, planned_requests, preflight};
use super::{step_plan, what_was_asked, LoadPlan, SweepError, SweepOptions};
use crate::record::Outcome;
use crate::slo::spec::SloSet;
use crate::slo::{classify, Verdict as SloVerdict};
use serde_json::json;

/// Repetitions of every load on each target, by default.
pub const DEFAULT_REPETITIONS: usize = 5;

/// What a comparison was asked.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Everything but the targets; its `target` is A.
    pub sweep: SweepOptions,
    /// Target B.
    pub other: String,
    /// How many times each load runs on each target.
    pub repetitions: usize,
}

/// Both curves and the verdict.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// A's curve, every repetition of a load pooled.
    pub a: Report,
    /// B's curve.
    pub b: Report,
    /// The verdict on B against A.
    pub verdict: Verdict,
    /// Repetitions of each load.
    pub repetitions: usize,
}

/// Runs the comparison.
pub async fn run(options: CompareOptions) -> Result<Comparison, SweepError> {
    let sweep = &options.sweep;
    check_slos(&sweep.slos)?;
    let mut loads: Vec<Load> = match &sweep.loads {
        LoadPlan::Concurrency(list) => list.iter().map(|&c| Load::Concurrency(c)).collect(),
        LoadPlan::Rate(list) => list.iter().map(|&r| Load::Rate(r)).collect(),
        LoadPlan::Auto { .. } | LoadPlan::AutoRate { .. } => {
            return Err(SweepError::Usage(
                "--compare measures both targets at the same loads: list them with --rate, --concurrency or \
                 --rate-scale"
                    .into(),
            ))
        }
    };
    loads.sort_by(|a, b| a.value().total_cmp(&b.value()));
    loads.dedup();
    if options.repetitions == 0 {
        return Err(SweepError::Usage("--repetitions must be at least 1".into()));
    }
    let targets = [
        connect(sweep, &sweep.target).await?,
        connect(sweep, &options.other).await?,
    ];
    // One set of requests for both: what differs between A and B is the target alone.
    let scale = super::prompt_scale(sweep, &targets[0]).await;
    let bodies = Bodies::new(planned_requests(sweep, &targets[0], &scale)?);
    for target in &targets {
        preflight(target, &bodies.planned()[0]).await?;
    }
    let mut samples: [Vec<Vec<Vec<Sample>>>; 2] = std::array::from_fn(|_| vec![Vec::new(); loads.len()]);
    let mut clients: [Vec<Vec<ClientHealth>>; 2] = std::array::from_fn(|_| vec![Vec::new(); loads.len()]);
    for repetition in 0..options.repetitions {
        for (step, &load) in loads.iter().enumerate() {
            let order = if repetition % 2 == 0 { [0, 1] } else { [1, 0] };
            // The same arrival times for both at this load and repetition, others at the next.
            let plan = step_plan(sweep, load, (step * options.repetitions + repetition) as u64);
            for side in order {
                let label = format!("{} #{}: ", ["A", "B"][side], repetition + 1);
                let (got, client) = hold(&targets[side], bodies.restart(), load, &plan, &label).await;
                judge_step(load, plan.duration, &got, client, &sweep.slos, &label);
                samples[side][step].push(got);
                clients[side][step].push(client);
            }
        }
    }
    let windows: Vec<std::time::Duration> = loads
        .iter()
        .enumerate()
        .map(|(step, &load)| step_plan(sweep, load, step as u64).duration * options.repetitions as u32)
        .collect();
    let report = |side: usize| {
        let steps: Vec<StepResult> = loads
            .iter()
            .enumerate()
            .map(|(step, &load)| {
                let pooled: Vec<Sample> = samples[side][step].iter().flatten().cloned().collect();
                let pooled_step = StepResult::from_samples(load, windows[step], &pooled, &sweep.slos);
                match ClientHealth::worst(&clients[side][step]) {
                    Some(client) => pooled_step.with_client(client),
                    None => pooled_step,
                }
            })
            .collect();
        Report {
            target: targets[side].base().to_string(),
            model: targets[side].model().to_string(),
            endpoint: sweep.endpoint,
            slos: sweep.slos.clone(),
            knee: Knee::from_steps(&steps, false),
            steps,
            gpu_hour_price: sweep.gpu_hour_price,
            workload: describe_workload(sweep),
            asked: what_was_asked(sweep),
        }
    };
    let runs = |side: usize| -> Vec<Run> {
        samples[side]
            .iter()
            .enumerate()
            .flat_map(|(step, repetitions)| {
                repetitions.iter().enumerate().map(move |(repetition, got)| Run {
                    step,
                    repetition,
                    requests: observations(got, &sweep.slos),
                })
            })
            .collect()
    };
    let judging = Judging {
        loads: loads.iter().map(|l| l.value()).collect(),
        slos: sweep
            .slos
            .slos
            .iter()
            .enumerate()
            .take(MAX_SLOS)
            .map(|(i, slo)| (slo.name.to_string(), slo.objective, sweep.slos.decides_goodput(i)))
            .collect(),
    };
    let verdict = verdict::judge(&runs(0), &runs(1), &judging, sweep.seed);
    Ok(Comparison {
        a: report(0),
        b: report(1),
        verdict,
        repetitions: options.repetitions,
    })
}

/// A run's requests as the verdict sees them, in the order they were sent.
fn observations(samples: &[Sample], slos: &SloSet) -> Vec<Observation> {
    let mut sorted: Vec<&Sample> = samples.iter().collect();
    sorted.sort_by_key(|s| s.sent);
    sorted
        .into_iter()
        .map(|sample| {
            let record = &sample.record;
            let (mut counted, mut good) = (0u64, 0u64);
            for (i, slo) in slos.slos.iter().enumerate().take(MAX_SLOS) {
                match classify(slo, record) {
                    SloVerdict::Good => {
                        counted |= 1 << i;
                        good |= 1 << i;
                    }
                    SloVerdict::Bad => counted |= 1 << i,
                    SloVerdict::NotCounted => {}
                }
            }
            let success = record.outcome == Outcome::Success;
            Observation {
                ttft: record.ttft.filter(|_| success).map(|d| d.as_secs_f64()),
                tpot: record.tpot().filter(|_| success).map(|d| d.as_secs_f64()),
                counted,
                good,
            }
        })
        .collect()
}

impl Comparison {
    /// Both tables and the verdict, for the terminal.
    pub fn render(&self) -> String {
        let mut out = format!("A: {}", self.a.render());
        out.push_str(&format!("\nB: {}", self.b.render()));
        out.push_str(&format!(
            "\nB against A, {} interleaved repetitions of each load; intervals at {:.2} %, tests at p < {:.4}:\n",
            self.repetitions,
            (1.0 - self.verdict.level) * 100.0,
            self.verdict.level
        ));
        out.push_str(&format!(
            "{:<24} {:>14} {:>14} {:>14} {:>32} {:>8}  verdict\n",
            "figure", "A", "B", "B − A", "interval", "p"
        ));
        let unit = self.a.load_unit();
        for d in &self.verdict.differences {
            let shown = |v: f64, signed: bool| {
                if !v.is_finite() {
                    return "–".to_string();
                }
                let sign = if signed && v >= 0.0 { "+" } else { "" };
                if d.figure.starts_with("attainment") {
                    format!("{sign}{:.2} {}", v * 100.0, if signed { "pp" } else { "%" })
                } else if d.figure == "knee" {
                    format!("{sign}{v:.2}{unit}")
                } else {
                    format!("{sign}{:.1} ms", v * 1e3)
                }
            };
            out.push_str(&format!(
                "{:<24} {:>14} {:>14} {:>14} {:>32} {:>8}  {}\n",
                d.figure,
                shown(d.a, false),
                shown(d.b, false),
                shown(d.difference, true),
                format!("[{}, {}]", shown(d.interval.0, true), shown(d.interval.1, true)),
                if d.p_value.is_finite() {
                    format!("{:.4}", d.p_value)
                } else {
                    "–".into()
                },
                d.verdict
            ));
        }
        if let Some(caveat) = &self.verdict.caveat {
            out.push_str(&format!("note: {caveat}\n"));
        }
        out.push_str(&format!("{}\n", self.verdict.summary()));
        out
    }

    /// The JSON document `--json` writes.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "repetitions": self.repetitions,
            "verdict": {
                "summary": self.verdict.summary(),
                "level": self.verdict.level,
                "caveat": self.verdict.caveat,
                "differences": self.verdict.differences.iter().map(|d| json!({
                    "figure": d.figure,
                    "a": number(d.a),
                    "b": number(d.b),
                    "difference": number(d.difference),
                    "interval": [number(d.interval.0), number(d.interval.1)],
                    "p_value": number(d.p_value),
                    "verdict": d.verdict,
                })).collect::<Vec<_>>(),
            },
        })
    }
}
