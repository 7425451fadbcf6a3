//! `llmslo sweep`: measures an OpenAI-compatible endpoint's latency–load curve
//! from the client side, judges every step against the SLO file, and finds the knee: the
//! highest load at which every deciding SLO still holds. The requests are fixed-length, a
//! dataset's, a replayed trace's, or drawn from a workload's shape.

pub mod args;
pub mod asked;
pub mod calibrate;
pub mod client;
pub mod compare;
pub mod health;
pub mod knee;
pub mod load;
pub mod plot;
pub mod prompts;
pub mod report;
pub mod saved;
pub mod stats;
pub mod verdict;

use crate::flags::terminal_safe;
use crate::record::Outcome;
use crate::slo::spec::{SloKind, SloSet};
use crate::workload::shape::Shape;
use crate::workload::trace::{Trace, TraceRow};
use asked::Asked;
use calibrate::PromptScale;
use client::{Endpoint, Planned, RequestShape, Requester, Sample};
use health::ClientHealth;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use knee::{KneeSearch, RateSearch};
use load::{Arrivals, Bodies, StepPlan};
use prompts::{Entry, Prompt};
use report::{Knee, Report};
use serde_json::{json, Map};
use stats::{Judgement, Load, StepResult};
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
    /// These open-loop request rates (requests per second), in order.
    Rate(Vec<f64>),
    /// From `start` requests per second, halving or doubling, then bisecting, to the knee;
    /// never above `max`.
    AutoRate {
        /// The first rate tried.
        start: f64,
        /// The highest rate tried.
        max: f64,
    },
}

/// What the requests are like.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// One prompt length (or a dataset's prompts) and one output length, from the flags.
    Fixed,
    /// A trace replayed whole at each step: its requests at its own times, scaled to the
    /// step's rate.
    Replay {
        /// The file it came from, for the report.
        name: String,
        /// Its requests.
        trace: Trace,
    },
    /// Requests drawn from a workload's shape.
    Shape(Shape),
}

/// Requests drawn from a shape for each step (taken in turn, and again when all were sent).
pub const DRAWN_REQUESTS: usize = 10_000;

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
    /// How rate steps space their arrivals (a shape's burstiness unless set).
    pub arrivals: Arrivals,
    /// What the requests are like.
    pub workload: Workload,
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
    check_slos(&options.slos)?;
    let requester = connect(&options, &options.target).await?;
    let scale = prompt_scale(&options, &requester).await;
    let bodies = Bodies::new(planned_requests(&options, &requester, &scale)?);
    preflight(&requester, &bodies.planned()[0]).await?;

    let mut steps = Vec::new();
    let mut search = Search::new(&options.loads);
    while let Some(load) = search.next() {
        // Each step draws its own arrival times (the same seed would replay one pattern at
        // every rate, scaled) and sends the same requests from the first.
        let step_plan = step_plan(&options, load, steps.len() as u64);
        let (samples, client) = hold(&requester, bodies.restart(), load, &step_plan, "").await;
        let step = judge_step(load, step_plan.duration, &samples, client, &options.slos, "");
        // Too few requests to judge is not a miss: the search goes on, and the report says so.
        // A client that fell behind cannot judge higher loads either.
        search.observe(
            load,
            !matches!(step.verdict(), Judgement::Missed | Judgement::ClientLimited),
        );
        steps.push(step);
    }
    steps.sort_by(|a, b| a.load.value().total_cmp(&b.load.value()));
    let knee = Knee::from_steps(&steps, search.reached_max());
    Ok(Report {
        target: requester.base().to_string(),
        model: requester.model().to_string(),
        endpoint: options.endpoint,
        slos: options.slos.clone(),
        steps,
        knee,
        gpu_hour_price: options.gpu_hour_price,
        workload: describe_workload(&options),
        asked: what_was_asked(&options),
    })
}

/// A sweep needs a latency SLO to judge its loads by.
pub fn check_slos(slos: &SloSet) -> Result<(), SweepError> {
    if slos.slos.iter().any(|s| !matches!(s.kind, SloKind::Availability)) {
        return Ok(());
    }
    Err(SweepError::Usage(
        "the config has no latency SLO to judge the load by: add a `slos:` entry with ttft, tpot or e2e \
         (see docs/slos.md)"
            .into(),
    ))
}

/// A client for `target`, asking for `--model` or the first model the target lists.
pub async fn connect(options: &SweepOptions, target: &str) -> Result<Requester, SweepError> {
    let base = base_url(target)?;
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
    Requester::new(shape).map_err(SweepError::Usage)
}

/// The loads still to measure: a list, or a search.
enum Search {
    /// These, in order (the next at the end).
    List(Vec<Load>),
    /// A concurrency search.
    Concurrency(KneeSearch),
    /// A rate search.
    Rate(RateSearch),
}

impl Search {
    fn new(plan: &LoadPlan) -> Self {
        let mut list: Vec<Load> = match plan {
            LoadPlan::Concurrency(list) => list.iter().map(|&c| Load::Concurrency(c)).collect(),
            LoadPlan::Rate(list) => list.iter().map(|&r| Load::Rate(r)).collect(),
            LoadPlan::Auto { max } => return Search::Concurrency(KneeSearch::new(*max)),
            LoadPlan::AutoRate { start, max } => return Search::Rate(RateSearch::new(*start, *max)),
        };
        list.reverse();
        Search::List(list)
    }

    fn next(&mut self) -> Option<Load> {
        match self {
            Search::List(list) => list.pop(),
            Search::Concurrency(search) => search.next().map(Load::Concurrency),
            Search::Rate(search) => search.next().map(Load::Rate),
        }
    }

    fn observe(&mut self, load: Load, met: bool) {
        match (self, load) {
            (Search::Concurrency(search), Load::Concurrency(c)) => search.observe(c, met),
            (Search::Rate(search), Load::Rate(r)) => search.observe(r, met),
            _ => {}
        }
    }

    fn reached_max(&self) -> bool {
        match self {
            Search::List(_) => false,
            Search::Concurrency(search) => search.reached_max(),
            Search::Rate(search) => search.reached_max(),
        }
    }
}

/// How step number `index` at `load` runs: a replayed trace runs whole, once, at the step's
/// rate; anything else holds the load for the warm-up and the window.
pub fn step_plan(options: &SweepOptions, load: Load, index: u64) -> StepPlan {
    let seed = options.seed.wrapping_add(index);
    match (&options.workload, load) {
        (Workload::Replay { trace, .. }, Load::Rate(rate)) => {
            let scale = rate / trace.rate();
            let times: Vec<Duration> = trace.rows.iter().map(|r| r.offset().div_f64(scale)).collect();
            StepPlan {
                warmup: Duration::ZERO,
                duration: times.last().copied().unwrap_or_default(),
                seed,
                arrivals: Arrivals::Trace(Arc::new(times)),
            }
        }
        _ => StepPlan {
            warmup: options.warmup,
            duration: options.duration,
            seed,
            arrivals: options.arrivals.clone(),
        },
    }
}

/// The requests every step sends, in order: a trace's rows, requests drawn from a shape
/// (seeded), or the fixed prompt or dataset.
pub fn planned_requests(
    options: &SweepOptions,
    requester: &Requester,
    scale: &PromptScale,
) -> Result<Vec<Planned>, SweepError> {
    let sized = |rows: Vec<TraceRow>| {
        rows.into_iter()
            .enumerate()
            .map(|(i, row)| {
                let endpoint = endpoint_of(options, &row.api);
                Planned {
                    endpoint,
                    prompt: Prompt::Sized {
                        words: scale.words(endpoint, row.input_length),
                        salt: options.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
                    },
                    output_tokens: row.output_length,
                }
            })
            .collect()
    };
    Ok(match &options.workload {
        Workload::Replay { trace, .. } => sized(trace.rows.clone()),
        Workload::Shape(shape) => sized(shape.draw(DRAWN_REQUESTS, options.seed)),
        Workload::Fixed => {
            let entries: Vec<Entry> = match &options.dataset {
                Some(path) => prompts::load_dataset(path).map_err(SweepError::Usage)?,
                None => vec![Entry {
                    prompt: prompts::synthetic(scale.synthetic_words(options.endpoint, options.prompt_tokens)),
                    output_tokens: None,
                }],
            };
            entries
                .into_iter()
                .map(|e| requester.plan(e.prompt, e.output_tokens.unwrap_or(options.output_tokens)))
                .collect()
        }
    })
}

/// The endpoint a trace's `api` names, else `--endpoint`.
fn endpoint_of(options: &SweepOptions, api: &Option<String>) -> Endpoint {
    api.as_deref().and_then(Endpoint::from_api).unwrap_or(options.endpoint)
}

/// How many words make a token on `requester`'s target, for every workload whose prompts the
/// sweep sizes (the synthetic prompt, a trace or a shape), told on standard error; a dataset's
/// prompts are sent as written.
pub async fn prompt_scale(options: &SweepOptions, requester: &Requester) -> PromptScale {
    let apis: Vec<Option<&str>> = match &options.workload {
        Workload::Fixed if options.dataset.is_some() => return PromptScale::default(),
        Workload::Fixed => vec![None],
        Workload::Replay { trace, .. } => trace.rows.iter().map(|r| r.api.as_deref()).collect(),
        Workload::Shape(shape) => shape.classes.iter().map(|c| Some(c.api.as_str())).collect(),
    };
    let mut endpoints: Vec<Endpoint> = Vec::new();
    for api in apis {
        let endpoint = api.and_then(Endpoint::from_api).unwrap_or(options.endpoint);
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }
    match calibrate::measure(requester, &endpoints).await {
        Some(mut scale) => {
            if matches!(options.workload, Workload::Fixed) {
                calibrate::fit_synthetic(requester, options.endpoint, options.prompt_tokens, &mut scale).await;
            }
            eprint!("llmslo sweep: {}", scale.describe());
            scale
        }
        None => {
            eprintln!("llmslo sweep: the target states no plausible prompt token counts: prompts are a word a token");
            PromptScale::default()
        }
    }
}

/// What `options` ask, as saved with the results.
pub fn what_was_asked(options: &SweepOptions) -> Asked {
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
    map.insert("loads".into(), json!(asked_loads(&options.loads)));
    let open_loop = matches!(options.loads, LoadPlan::Rate(_) | LoadPlan::AutoRate { .. });
    let arrivals = match &options.workload {
        Workload::Replay { .. } => Some("the trace's own times".to_string()),
        _ => open_loop.then(|| asked_arrivals(&options.arrivals)),
    };
    map.insert("arrivals".into(), json!(arrivals));
    Asked(map)
}

/// The loads as asked: a list, or a search and its bounds.
fn asked_loads(plan: &LoadPlan) -> String {
    let list = |values: Vec<String>| values.join(",");
    match plan {
        LoadPlan::Concurrency(levels) => format!("concurrency {}", list(levels.iter().map(usize::to_string).collect())),
        LoadPlan::Auto { max } => format!("concurrency auto up to {max}"),
        LoadPlan::Rate(rates) => format!("rate {}", list(rates.iter().map(|r| format!("{r}")).collect())),
        LoadPlan::AutoRate { start, max } => format!("rate auto from {start} up to {max}"),
    }
}

/// How open-loop arrivals were spaced.
fn asked_arrivals(arrivals: &Arrivals) -> String {
    match arrivals {
        Arrivals::Gamma { burstiness } if *burstiness == 1.0 => "poisson".to_string(),
        Arrivals::Gamma { burstiness } => format!("gamma, burstiness {burstiness}"),
        Arrivals::Bursts(b) => format!("bursts {:?} on, {:?} off", b.on, b.off),
        Arrivals::Exact => "exact count, uniform times".to_string(),
        Arrivals::Trace(_) => "the trace's own times".to_string(),
    }
}

/// The workload in a few lines, for the report, when it is not the fixed one.
pub fn describe_workload(options: &SweepOptions) -> Option<String> {
    match &options.workload {
        Workload::Fixed => None,
        Workload::Replay { name, trace } => {
            let classes: String = Shape::of(trace, options.endpoint.api())
                .map(|s| s.describe())
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(|line| format!("{line}\n"))
                .collect();
            Some(format!(
                "workload: replay of {name}: {} requests over {:.1} s ({:.2} req/s at its own timing)\n{classes}",
                trace.rows.len(),
                trace.span().as_secs_f64(),
                trace.rate(),
            ))
        }
        Workload::Shape(shape) => Some(shape.describe()),
    }
}

/// Holds one step's load, with its progress bar (on a terminal), and returns its samples and
/// how the client fared; `label` names the target when there are two.
pub async fn hold(
    requester: &Requester,
    bodies: Arc<Bodies>,
    load: Load,
    plan: &StepPlan,
    label: &str,
) -> (Vec<Sample>, ClientHealth) {
    let terminal = std::io::stderr().is_terminal();
    let bar = if terminal {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix}{bar:30.cyan/blue} {elapsed:>4} {msg}")
            .expect("a valid template")
            .progress_chars("█▓░"),
    );
    bar.set_prefix(label.to_string());
    let samples = load::run_step(requester, bodies, load, plan, &bar).await;
    bar.finish_and_clear();
    samples
}

/// A step's figures from its samples and its client's health, told on standard error (a step
/// with nothing to judge by is kept, with its reason).
pub fn judge_step(
    load: Load,
    window: Duration,
    samples: &[Sample],
    client: ClientHealth,
    slos: &SloSet,
    label: &str,
) -> StepResult {
    let step = StepResult::from_samples(load, window, samples, slos).with_client(client);
    // A step's line and note can quote the target's answers: shown, never obeyed.
    eprintln!(
        "llmslo sweep: {}",
        terminal_safe(&format!("{label}{}", report::step_line(&step)))
    );
    if let Some(note) = step.note() {
        let note = format!("{label}{}: {note}; the sweep goes on", step.load);
        eprintln!("llmslo sweep: {}", terminal_safe(&note));
    }
    if step.client_behind() {
        let consequence = if step.verdict() == Judgement::ClientLimited {
            "its misses may be the client's, so the step is not judged"
        } else {
            "the SLOs held all the same"
        };
        eprintln!(
            "llmslo sweep: {label}{}: the client fell behind ({}; bound {:.1} ms): {consequence}",
            step.load,
            client.describe(),
            step.lag_bound_s * 1e3
        );
    }
    step
}

/// One request before any step: an unreachable target, a refused request or an endpoint
/// that does not stream stops the sweep here with the reason.
async fn preflight(requester: &Requester, planned: &Planned) -> Result<(), SweepError> {
    let sample = requester.send(planned).await;
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

/// `value` of `flag` as an `http://` or `https://` URL with a host; `expected` says what
/// else was wanted.
fn http_uri(flag: &str, value: &str, expected: &str) -> Result<http::Uri, SweepError> {
    let uri: http::Uri = value
        .parse()
        .map_err(|e| SweepError::Usage(format!("{flag} {value}: not a URL ({e})")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(SweepError::Usage(format!("{flag} {value}: expected {expected}")));
    }
    Ok(uri)
}

/// The target as a base URL: `http://` or `https://`, no trailing `/` or `/v1`.
fn base_url(target: &str) -> Result<String, SweepError> {
    http_uri("--target", target, "http://host:port or https://host")?;
    let trimmed = target.trim_end_matches('/');
    Ok(trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_string())
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
