//! `llmslo sweep`: measures an OpenAI-compatible endpoint's latency–load curve
//! from the client side, judges every step against the SLO file, and finds the knee: the
//! highest load at which every deciding SLO still holds.

pub mod args;
pub mod client;
pub mod knee;
pub mod load;
pub mod plot;
pub mod prompts;
pub mod report;
pub mod stats;

use crate::record::Outcome;
use crate::slo::spec::{SloKind, SloSet};
use client::{Endpoint, RequestShape, Requester};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use knee::KneeSearch;
use load::{Bodies, Bursts, StepPlan};
use prompts::{Entry, Prompt};
use report::{Knee, Report};
use stats::{Load, StepResult};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The loads a sweep measures.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadPlan {
    /// These closed-loop concurrencies, in order.
    Concurrency(Vec<usize>),
    /// Doubling from 1, then bisecting, to the knee; never above `max`.
    Auto {
        /// The highest concurrency tried.
        max: usize,
    },
    /// These Poisson request rates (requests per second), in order.
    Rate(Vec<f64>),
}

/// Everything `llmslo sweep` was asked.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// The target's base URL (`http://host:port`).
    pub target: String,
    /// The SLOs every step is judged against.
    pub slos: SloSet,
    /// The model to ask for (default: the first the target lists).
    pub model: Option<String>,
    /// The route.
    pub endpoint: Endpoint,
    /// Bearer token for the target.
    pub api_key: Option<String>,
    /// The loads.
    pub loads: LoadPlan,
    /// Unrecorded time before each step's window.
    pub warmup: Duration,
    /// Each step's measured window.
    pub duration: Duration,
    /// Length of the synthetic prompts.
    pub prompt_tokens: u32,
    /// Output tokens asked of each request (a dataset line may set its own).
    pub output_tokens: u32,
    /// Prompts from a JSONL file instead of synthetic ones.
    pub dataset: Option<PathBuf>,
    /// Ask for exactly `output_tokens` (`ignore_eos`).
    pub ignore_eos: bool,
    /// Longest one request may take.
    pub request_timeout: Duration,
    /// PEM certificates trusted for an `https://` target besides the public roots.
    pub ca_cert: Option<PathBuf>,
    /// Seed for arrival times.
    pub seed: u64,
    /// The accelerators' price for an hour, to price a million tokens at each step.
    pub gpu_hour_price: Option<f64>,
    /// Rate steps send their requests in on/off bursts (the same mean rate).
    pub bursts: Option<Bursts>,
}

/// Why a sweep could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The flags, SLO file or dataset are not usable.
    #[error("{0}")]
    Usage(String),
    /// The target could not be measured.
    #[error("{0}")]
    Target(String),
}

/// Runs the sweep and returns what it measured.
pub async fn run(options: SweepOptions) -> Result<Report, SweepError> {
    if !options
        .slos
        .slos
        .iter()
        .any(|s| !matches!(s.kind, SloKind::Availability))
    {
        return Err(SweepError::Usage(
            "the config has no latency SLO to judge the load by: add a `slos:` entry with ttft, tpot or e2e \
             (see docs/slos.md)"
                .into(),
        ));
    }
    let base = base_url(&options.target)?;
    let entries: Vec<Entry> = match &options.dataset {
        Some(path) => prompts::load_dataset(path).map_err(SweepError::Usage)?,
        None => vec![Entry {
            prompt: prompts::synthetic(options.prompt_tokens),
            output_tokens: None,
        }],
    };
    let mut shape = RequestShape {
        base: base.clone(),
        endpoint: options.endpoint,
        model: options.model.clone().unwrap_or_default(),
        api_key: options.api_key.clone(),
        ignore_eos: options.ignore_eos,
        timeout: options.request_timeout,
        ca_cert: options.ca_cert.clone(),
    };
    if options.model.is_none() {
        let lister = Requester::new(shape.clone()).map_err(SweepError::Usage)?;
        shape.model = lister
            .first_model()
            .await
            .map_err(SweepError::Target)?
            .ok_or_else(|| SweepError::Target(format!("{base}/v1/models lists no model: pass --model")))?;
    }
    let requester = Requester::new(shape).map_err(SweepError::Usage)?;
    let bodies = Arc::new(Bodies::new(&requester, &entries, options.output_tokens));
    let first = &entries[0];
    preflight(
        &requester,
        &first.prompt,
        first.output_tokens.unwrap_or(options.output_tokens),
    )
    .await?;

    let plan = StepPlan {
        warmup: options.warmup,
        duration: options.duration,
        seed: options.seed,
        bursts: options.bursts,
    };
    let mut steps = Vec::new();
    let mut search = match options.loads {
        LoadPlan::Auto { max } => Some(KneeSearch::new(max)),
        _ => None,
    };
    let mut queue: Vec<Load> = match &options.loads {
        LoadPlan::Concurrency(list) => list.iter().map(|&c| Load::Concurrency(c)).collect(),
        LoadPlan::Rate(list) => list.iter().map(|&r| Load::Rate(r)).collect(),
        LoadPlan::Auto { .. } => Vec::new(),
    };
    queue.reverse();
    loop {
        let load = match search.as_ref() {
            Some(search) => search.next().map(Load::Concurrency),
            None => queue.pop(),
        };
        let Some(load) = load else { break };
        // Each step draws its own arrival times: the same seed would replay one pattern at
        // every rate, scaled.
        let step_plan = StepPlan {
            seed: plan.seed.wrapping_add(steps.len() as u64),
            ..plan.clone()
        };
        let step = measure(&requester, bodies.clone(), load, &step_plan, &options.slos).await?;
        if let (Some(search), Load::Concurrency(c)) = (search.as_mut(), load) {
            // Too few requests to judge is not a miss: the search goes on, and the report says so.
            search.observe(c, step.verdict() != stats::Judgement::Missed);
        }
        steps.push(step);
    }
    steps.sort_by(|a, b| load_order(a.load).total_cmp(&load_order(b.load)));
    let knee = Knee::from_steps(&steps, search.as_ref().is_some_and(KneeSearch::reached_max));
    Ok(Report {
        target: base,
        model: requester.model().to_string(),
        endpoint: options.endpoint,
        slos: options.slos.clone(),
        steps,
        knee,
        gpu_hour_price: options.gpu_hour_price,
    })
}

/// Measures one step, with its progress bar; a step with nothing to judge by is kept, with
/// its reason.
async fn measure(
    requester: &Requester,
    bodies: Arc<Bodies>,
    load: Load,
    plan: &StepPlan,
    slos: &SloSet,
) -> Result<StepResult, SweepError> {
    let terminal = std::io::stderr().is_terminal();
    let bar = if terminal {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30.cyan/blue} {elapsed:>4} {msg}")
            .expect("a valid template")
            .progress_chars("█▓░"),
    );
    let samples = load::run_step(requester, bodies, load, plan, &bar).await;
    let step = StepResult::from_samples(load, plan.duration, &samples, slos);
    let line = report::step_line(&step);
    if terminal {
        bar.finish_with_message(line);
    } else {
        eprintln!("llmslo sweep: {line}");
    }
    if let Some(note) = step.note() {
        eprintln!("llmslo sweep: {}: {note}; the sweep goes on", step.load);
    }
    Ok(step)
}

/// One request before any step: an unreachable target, a refused request or an endpoint
/// that does not stream stops the sweep here with the reason.
async fn preflight(requester: &Requester, prompt: &Prompt, output_tokens: u32) -> Result<(), SweepError> {
    let sample = requester.send(requester.body(prompt, output_tokens)).await;
    let message = sample.failure.unwrap_or_default();
    match sample.record.outcome {
        Outcome::Success => Ok(()),
        Outcome::ConnectError => Err(SweepError::Target(message)),
        Outcome::ClientError => Err(SweepError::Target(format!("the target refused the request: {message}"))),
        _ if message.contains("not an event stream") => Err(SweepError::Target(message)),
        // A 5xx may pass: it is counted in the steps, and fatal only if every request fails.
        _ => Ok(()),
    }
}

/// The target as a base URL: `http://` or `https://`, no trailing `/` or `/v1`.
fn base_url(target: &str) -> Result<String, SweepError> {
    let uri: http::Uri = target
        .parse()
        .map_err(|e| SweepError::Usage(format!("--target {target}: not a URL ({e})")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(SweepError::Usage(format!(
            "--target {target}: expected http://host:port or https://host"
        )));
    }
    let trimmed = target.trim_end_matches('/');
    Ok(trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string())
}

/// Sorts steps by their load.
fn load_order(load: Load) -> f64 {
    match load {
        Load::Concurrency(c) => c as f64,
        Load::Rate(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_urls() {
        assert_eq!(base_url("http://127.0.0.1:8000").unwrap(), "http://127.0.0.1:8000");
        assert_eq!(base_url("http://engine:8000/v1/").unwrap(), "http://engine:8000");
        assert_eq!(base_url("http://gw/llm").unwrap(), "http://gw/llm");
        assert_eq!(
            base_url("https://api.example.com/v1").unwrap(),
            "https://api.example.com"
        );
        assert!(base_url("ftp://host").is_err());
        assert!(base_url("127.0.0.1:8000")
            .unwrap_err()
            .to_string()
            .contains("expected http://host:port"));
        assert!(base_url("http://").is_err());
    }
}
