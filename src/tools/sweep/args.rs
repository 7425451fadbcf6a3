//! `llmslo sweep`'s flags, their checks, and the run from flags to table, JSON and plot.

use super::client::Endpoint;
use super::compare::{CompareOptions, Comparison};
use super::load::{Arrivals, Bursts};
use super::report::Report;
use super::saved::SavedComparison;
use super::{describe_workload, LoadPlan, SweepError, SweepOptions, Workload};
use crate::config::Config;
use crate::flags::{duration, terminal_safe, EXIT_CONFIG};
use crate::slo::spec::SloKind;
use crate::workload::shape::Shape;
use crate::workload::trace::{read_trace_file, Trace};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The flags of `llmslo sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The OpenAI-compatible endpoint's base URL, e.g. http://127.0.0.1:8000 or https://llm.example.com.
    #[arg(long, required_unless_present = "compare", conflicts_with = "compare")]
    target: Option<String>,
    /// Compare two targets (base URLs) at the same loads with the same requests, interleaved,
    /// and say whether B differs from A beyond the noise; or two saved results (`--json` files)
    /// on one report and plot.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    compare: Vec<String>,
    /// How many times each load runs on each target in a comparison [default: 5].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
    repetitions: Option<u64>,
    /// The config file whose `slos:` (and `goodput.require`) judge every step.
    #[arg(long, env = "LLMSLO_CONFIG")]
    config: PathBuf,
    /// The model to ask for [default: the first one the target lists at /v1/models].
    #[arg(long)]
    model: Option<String>,
    /// The route to load.
    #[arg(long, value_enum, default_value = "chat")]
    endpoint: Endpoint,
    /// Bearer token, when the target needs one.
    #[arg(long, env = "LLMSLO_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Closed-loop clients per step (`1,2,4,8`), or `auto` to search for the knee [default: auto].
    #[arg(long, value_delimiter = ',', conflicts_with = "rate")]
    concurrency: Vec<String>,
    /// Open-loop steps instead, in requests per second (`0.5,1,2`), or `auto` to search for the
    /// knee in rate (the default with a workload).
    #[arg(long, value_delimiter = ',')]
    rate: Vec<String>,
    /// A rate search goes no higher than this many requests per second [default: 1000].
    #[arg(long)]
    max_rate: Option<f64>,
    /// Send each rate step's requests in bursts: ON of arrivals, then OFF of none (`2s/3s`), the same mean rate.
    #[arg(long, value_name = "ON/OFF", value_parser = bursts, conflicts_with = "burstiness")]
    bursts: Option<Bursts>,
    /// Space rate steps' arrivals by a gamma distribution of this shape, as vLLM's
    /// `--burstiness`: 1 is Poisson, below 1 burstier [default: the workload's, else 1].
    #[arg(long, value_name = "K")]
    burstiness: Option<f64>,
    /// Send exactly rate × duration requests in each rate step's window (and rate × warm-up
    /// before it), at uniformly random times: the step's sent rate is the rate asked.
    #[arg(long, conflicts_with_all = ["bursts", "burstiness"])]
    exact_arrivals: bool,
    /// Replay a trace: Mooncake-style JSONL (`timestamp` ms, `input_length`, `output_length`),
    /// Azure's CSV, or a sidecar's `/workload`; each step replays it whole.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dataset", "workload_from", "concurrency", "rate", "bursts", "burstiness"])]
    replay: Option<PathBuf>,
    /// Replay the trace at these multiples of its own rate (`0.5,1,2`), or `auto` to search for the
    /// knee [default: auto].
    #[arg(long, value_delimiter = ',', requires = "replay", conflicts_with = "rate")]
    rate_scale: Vec<String>,
    /// Load the target with the workload a sidecar saw: read its `/workload` (http://sidecar:9090),
    /// take its shape (rate, burstiness, API mix, lengths) and sweep the rate of that shape.
    #[arg(long, value_name = "URL", conflicts_with = "dataset")]
    workload_from: Option<String>,
    /// A workload shape file: written with --workload-from, read without it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dataset", "replay"])]
    workload: Option<PathBuf>,
    /// `--concurrency auto` goes no higher than this [default: 1024].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_concurrency: Option<u64>,
    /// Each step's measured window: requests sent in it are recorded [default: 30s].
    #[arg(long, value_parser = duration)]
    duration: Option<Duration>,
    /// Unrecorded load before each window, to reach a steady state [default: 5s].
    #[arg(long, value_parser = duration)]
    warmup: Option<Duration>,
    /// Length of the synthetic prompt, in tokens [default: 256].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000), conflicts_with = "dataset")]
    prompt_tokens: Option<u32>,
    /// Output tokens asked of every request (`max_tokens`; a dataset line's own `output_tokens`
    /// wins) [default: 128].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    output_tokens: Option<u32>,
    /// Prompts from a JSONL file (`{"prompt": …}`, `{"messages": […]}` or ShareGPT's `{"conversations": […]}`), taken in turn.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// Let the engine stop at end-of-sequence instead of sending `ignore_eos: true` (for engines that reject it).
    #[arg(long)]
    no_ignore_eos: bool,
    /// A request taking longer than this counts as a timeout.
    #[arg(long, default_value = "5m", value_parser = duration)]
    request_timeout: Duration,
    /// PEM certificates to trust for an https:// target, besides the public roots (a private CA).
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// The price of the target's accelerators for an hour: each step and the knee then say
    /// what a million output tokens cost there, PRICE / 3600 × 10⁶ / (output tok/s + W ×
    /// prompt tok/s), W from --input-token-weight.
    #[arg(long, value_name = "PRICE")]
    gpu_hour_price: Option<f64>,
    /// What a prompt token weighs against an output token in the cost (W above) [default: the
    /// config's `cost.input_token_weight`, else 0.1].
    #[arg(long, value_name = "W", requires = "gpu_hour_price")]
    input_token_weight: Option<f64>,
    /// Seed for the Poisson arrival times (step n draws from seed + n).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the results as JSON to this file (`-`: standard output, instead of the table).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG plot of the curve to this file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

impl SweepArgs {
    /// Checks the flags and the SLO file, reads the workload (from a sidecar, when asked) and
    /// turns them into options.
    pub async fn options(self) -> Result<SweepOptions, SweepError> {
        let usage = |m: String| Err(SweepError::Usage(m));
        let mut slos = Config::slos_from_file(&self.config).map_err(|e| SweepError::Usage(e.to_string()))?;
        if self.repetitions.is_some() && self.compare.is_empty() {
            return usage("--repetitions counts the runs of a comparison: give --compare A B".into());
        }
        if let Some(weight) = self.input_token_weight {
            if !(weight.is_finite() && weight >= 0.0) {
                return usage(format!("--input-token-weight {weight}: a weight of zero or more"));
            }
            slos.input_token_weight = weight;
        }
        let workload = self.workload_source().await?;
        self.refuse_what_does_not_apply(&workload)?;
        let max_rate = self.max_rate.unwrap_or(1000.0);
        if !(max_rate.is_finite() && max_rate > 0.0) {
            return usage(format!("--max-rate {max_rate}: a rate above zero"));
        }
        let max_concurrency = self.max_concurrency.unwrap_or(1024) as usize;
        let loads = if let Workload::Replay { trace, .. } = &workload {
            let rate = trace.rate();
            match rates(&self.rate_scale, "--rate-scale")? {
                Some(scales) => LoadPlan::Rate(scales.iter().map(|s| s * rate).collect()),
                None => LoadPlan::AutoRate {
                    start: rate,
                    max: max_rate.max(rate),
                },
            }
        } else if let Some(list) = rates(&self.rate, "--rate")? {
            LoadPlan::Rate(list)
        } else if !self.rate.is_empty() || (workload != Workload::Fixed && self.concurrency.is_empty()) {
            let start = match &workload {
                Workload::Shape(shape) if shape.rate.is_finite() && shape.rate > 0.0 => shape.rate,
                _ => 1.0,
            };
            LoadPlan::AutoRate {
                start: start.min(max_rate),
                max: max_rate,
            }
        } else {
            match self.concurrency.as_slice() {
                [] => LoadPlan::Auto { max: max_concurrency },
                [auto] if auto == "auto" => LoadPlan::Auto { max: max_concurrency },
                list => {
                    let mut levels = Vec::new();
                    for item in list {
                        match item.trim().parse::<usize>() {
                            Ok(c) if (1..=100_000).contains(&c) => levels.push(c),
                            _ => {
                                return usage(format!(
                                    "--concurrency {item}: expected `auto` or a list of client counts from 1 to 100000, like 1,2,4,8"
                                ))
                            }
                        }
                    }
                    LoadPlan::Concurrency(levels)
                }
            }
        };
        if let Some(k) = self.burstiness.filter(|k| !(k.is_finite() && *k > 0.0)) {
            return usage(format!("--burstiness {k}: a gamma shape above zero (1 is Poisson)"));
        }
        let open_loop = matches!(loads, LoadPlan::Rate(_) | LoadPlan::AutoRate { .. });
        let shaping = [
            ("--burstiness", self.burstiness.is_some()),
            ("--bursts", self.bursts.is_some()),
            ("--exact-arrivals", self.exact_arrivals),
        ];
        if let (Some((flag, _)), false) = (shaping.iter().find(|(_, given)| *given), open_loop) {
            return usage(format!("{flag} shapes open-loop arrivals: give --rate"));
        }
        if self.max_concurrency.is_some() && open_loop {
            return usage(
                "--max-concurrency bounds a concurrency search; these steps are rates: drop it, or use --max-rate"
                    .into(),
            );
        }
        if self.max_rate.is_some() && !open_loop {
            return usage(
                "--max-rate bounds a rate search; these steps are concurrencies: drop it, or use --max-concurrency"
                    .into(),
            );
        }
        let arrivals = match (self.bursts, self.burstiness, &workload) {
            _ if self.exact_arrivals => Arrivals::Exact,
            (Some(bursts), _, _) => Arrivals::Bursts(bursts),
            (None, Some(burstiness), _) => Arrivals::Gamma { burstiness },
            (None, None, Workload::Shape(shape)) => Arrivals::Gamma {
                burstiness: shape.burstiness,
            },
            (None, None, _) => Arrivals::default(),
        };
        if let Some(price) = self.gpu_hour_price.filter(|p| !(p.is_finite() && *p > 0.0)) {
            return usage(format!("--gpu-hour-price {price}: a price above zero"));
        }
        let duration = self.duration.unwrap_or(Duration::from_secs(30));
        if duration.is_zero() {
            return usage("--duration must be above zero".into());
        }
        let output_tokens = self.output_tokens.unwrap_or(128);
        if self.request_timeout.is_zero() {
            return usage("--request-timeout must be above zero".into());
        }
        let tpot_slo = slos.slos.iter().find(|s| matches!(s.kind, SloKind::Tpot(_)));
        if let (Some(slo), true) = (tpot_slo, output_tokens < 2) {
            return usage(format!(
                "--output-tokens {output_tokens}: TPOT needs at least 2 output tokens, and SLO `{}` judges TPOT",
                slo.name
            ));
        }
        Ok(SweepOptions {
            target: self
                .target
                .or_else(|| self.compare.first().cloned())
                .unwrap_or_default(),
            slos,
            model: self.model,
            endpoint: self.endpoint,
            api_key: self.api_key.filter(|k| !k.is_empty()),
            loads,
            warmup: self.warmup.unwrap_or(Duration::from_secs(5)),
            duration,
            prompt_tokens: self.prompt_tokens.unwrap_or(256),
            output_tokens,
            dataset: self.dataset,
            ignore_eos: !self.no_ignore_eos,
            request_timeout: self.request_timeout,
            ca_cert: self.ca_cert,
            seed: self.seed,
            gpu_hour_price: self.gpu_hour_price,
            arrivals,
            workload,
        })
    }

    /// The two saved results `--compare` names, when it names files rather than URLs; the
    /// flags that would shape a measurement are refused with them.
    fn saved_results(&self) -> Result<Option<(PathBuf, PathBuf)>, SweepError> {
        let [a, b] = self.compare.as_slice() else {
            return Ok(None);
        };
        let url = |s: &str| s.starts_with("http://") || s.starts_with("https://");
        match (url(a), url(b)) {
            (true, true) => return Ok(None),
            (false, false) => {}
            _ => {
                return Err(SweepError::Usage(format!(
                    "--compare {a} {b}: give two targets (http:// or https:// URLs) to measure, or two saved \
                     results (`--json` files) to show, not one of each"
                )))
            }
        }
        let measuring = [
            ("--repetitions", self.repetitions.is_some()),
            ("--rate", !self.rate.is_empty()),
            ("--concurrency", !self.concurrency.is_empty()),
            ("--rate-scale", !self.rate_scale.is_empty()),
            ("--replay", self.replay.is_some()),
            ("--workload-from", self.workload_from.is_some()),
            ("--workload", self.workload.is_some()),
            ("--dataset", self.dataset.is_some()),
            ("--bursts", self.bursts.is_some()),
            ("--burstiness", self.burstiness.is_some()),
            ("--gpu-hour-price", self.gpu_hour_price.is_some()),
            ("--input-token-weight", self.input_token_weight.is_some()),
            ("--exact-arrivals", self.exact_arrivals),
            ("--duration", self.duration.is_some()),
            ("--warmup", self.warmup.is_some()),
            ("--prompt-tokens", self.prompt_tokens.is_some()),
            ("--output-tokens", self.output_tokens.is_some()),
        ];
        if let Some((flag, _)) = measuring.iter().find(|(_, given)| *given) {
            return Err(SweepError::Usage(format!(
                "{flag} shapes a measurement, and saved results are shown as they were measured: drop it, or \
                 --compare two targets"
            )));
        }
        Ok(Some((a.into(), b.into())))
    }

    /// Flags that have nothing to shape in this mode are refused with the reason, not ignored:
    /// a replay's window is its trace and its lengths are the trace's; a shape's lengths are
    /// its classes'.
    fn refuse_what_does_not_apply(&self, workload: &Workload) -> Result<(), SweepError> {
        let (mode, reason, flags): (&str, &str, Vec<(&str, bool)>) = match workload {
            Workload::Replay { .. } => (
                "--replay",
                "each step replays the whole trace, at its own times and lengths",
                vec![
                    ("--duration", self.duration.is_some()),
                    ("--warmup", self.warmup.is_some()),
                    ("--prompt-tokens", self.prompt_tokens.is_some()),
                    ("--output-tokens", self.output_tokens.is_some()),
                    ("--exact-arrivals", self.exact_arrivals),
                ],
            ),
            Workload::Shape(_) => (
                if self.workload_from.is_some() {
                    "--workload-from"
                } else {
                    "--workload"
                },
                "the shape's classes set every request's lengths",
                vec![
                    ("--prompt-tokens", self.prompt_tokens.is_some()),
                    ("--output-tokens", self.output_tokens.is_some()),
                ],
            ),
            Workload::Fixed => return Ok(()),
        };
        match flags.iter().find(|(_, given)| *given) {
            Some((flag, _)) => Err(SweepError::Usage(format!(
                "{flag} does not apply with {mode}: {reason}; drop it"
            ))),
            None => Ok(()),
        }
    }

    /// The workload the flags name: a trace to replay, a shape read from a sidecar (and saved
    /// with --workload) or from a shape file, or the fixed one.
    async fn workload_source(&self) -> Result<Workload, SweepError> {
        let usage = |m: String| SweepError::Usage(m);
        if let Some(path) = &self.replay {
            let name = path.display().to_string();
            let trace = read_trace_file(&name, path).map_err(|e| usage(format!("--replay {e}")))?;
            if trace.rows.len() < 2 || trace.span().is_zero() {
                return Err(usage(format!(
                    "--replay {name}: a trace needs two requests at different times to have a rate"
                )));
            }
            return Ok(Workload::Replay { name, trace });
        }
        if let Some(url) = &self.workload_from {
            let url = workload_url(url)?;
            let text = super::client::fetch_text(&url, self.ca_cert.as_ref())
                .await
                .map_err(|e| SweepError::Target(format!("--workload-from {url}: {e}")))?;
            let trace = Trace::parse(&url, &text).map_err(|e| SweepError::Target(format!("--workload-from {e}")))?;
            let shape = Shape::of(&trace, self.endpoint.api())
                .map_err(|e| SweepError::Target(format!("--workload-from {url}: {e}")))?;
            if let Some(path) = &self.workload {
                std::fs::write(path, shape.to_yaml())
                    .map_err(|e| usage(format!("--workload {}: cannot write there: {e}", path.display())))?;
            }
            return Ok(Workload::Shape(shape));
        }
        if let Some(path) = &self.workload {
            let name = path.display().to_string();
            let text = crate::flags::read_bounded(path, MAX_SHAPE_BYTES)
                .map_err(|e| usage(format!("--workload {name}: {e}")))?;
            return Ok(Workload::Shape(Shape::from_yaml(&name, &text).map_err(usage)?));
        }
        Ok(Workload::Fixed)
    }
}

/// Largest workload shape file read: a shape is a few classes of a few lines each.
const MAX_SHAPE_BYTES: u64 = 1 << 20;

/// A list of rates or scales above zero; `None` for none or `auto`.
fn rates(list: &[String], flag: &str) -> Result<Option<Vec<f64>>, SweepError> {
    let what = if flag == "--rate" {
        "requests per second"
    } else {
        "multiples of the trace's own rate"
    };
    match list {
        [] => Ok(None),
        [auto] if auto == "auto" => Ok(None),
        list => list
            .iter()
            .map(|item| match item.trim().parse::<f64>() {
                Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
                _ => Err(SweepError::Usage(format!(
                    "{flag} {item}: expected `auto`, or {what} above zero like 0.5,1,2"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
    }
}

/// The trace endpoint of a sidecar's metrics port: `/workload` unless the URL names a path.
fn workload_url(url: &str) -> Result<String, SweepError> {
    let uri = super::http_uri(
        "--workload-from",
        url,
        "a sidecar's metrics port, like http://pod-ip:9464",
    )?;
    Ok(match uri.path() {
        "" | "/" | "/metrics" => format!(
            "{}://{}/workload",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().expect("checked")
        ),
        _ => url.to_string(),
    })
}

/// Parses `--bursts ON/OFF`: two durations, the burst above zero.
fn bursts(value: &str) -> Result<Bursts, String> {
    let (on, off) = value
        .split_once('/')
        .ok_or_else(|| format!("expected ON/OFF, two durations like 2s/3s, not `{value}`"))?;
    let bursts = Bursts {
        on: duration(on)?,
        off: duration(off)?,
    };
    if bursts.on.is_zero() {
        return Err("the burst (ON) must last longer than zero".into());
    }
    Ok(bursts)
}

/// Runs `llmslo sweep` from its flags: the table (or JSON) on standard output, the plot and
/// JSON files when asked.
pub async fn run(args: SweepArgs) -> ExitCode {
    let (json, plot) = (args.json.clone(), args.plot.clone());
    let fail = |e: SweepError| {
        eprintln!("llmslo sweep: {}", terminal_safe(&e.to_string()));
        match e {
            SweepError::Usage(_) => ExitCode::from(EXIT_CONFIG),
            SweepError::Target(_) => ExitCode::FAILURE,
        }
    };
    // Files are checked before the sweep, not found unwritable after it.
    for path in json.iter().chain(&plot).filter(|p| p.as_os_str() != "-") {
        if let Err(e) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            return fail(SweepError::Usage(format!(
                "{}: cannot write there: {e}",
                path.display()
            )));
        }
    }
    match args.saved_results() {
        Ok(Some((a, b))) => {
            let read = Config::slos_from_file(&args.config)
                .map_err(|e| SweepError::Usage(e.to_string()))
                .and_then(|slos| SavedComparison::read(&a, &b, &slos));
            return match read {
                Ok(saved) => show(Done::Saved(Box::new(saved)), json, plot),
                Err(e) => fail(e),
            };
        }
        Ok(None) => {}
        Err(e) => return fail(e),
    }
    let compare = args.compare.clone();
    let repetitions = args
        .repetitions
        .map_or(super::compare::DEFAULT_REPETITIONS, |n| n as usize);
    let options = match args.options().await {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    if let Some(workload) = describe_workload(&options) {
        eprint!("{}", terminal_safe(&workload));
    }
    let done = match compare.get(1) {
        Some(other) => super::compare::run(CompareOptions {
            sweep: options,
            other: other.clone(),
            repetitions,
        })
        .await
        .map(|c| Done::Compare(Box::new(c))),
        None => super::run(options).await.map(|r| Done::Sweep(Box::new(r))),
    };
    match done {
        Ok(done) => show(done, json, plot),
        Err(e) => fail(e),
    }
}

/// Prints what was done (the table, or the JSON with `--json -`) and writes the JSON and plot
/// files asked for.
fn show(done: Done, json: Option<PathBuf>, plot: Option<PathBuf>) -> ExitCode {
    let fail = |e: String| {
        eprintln!("llmslo sweep: {}", terminal_safe(&e));
        ExitCode::from(EXIT_CONFIG)
    };
    let json_to_stdout = json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if json_to_stdout {
        println!("{:#}", done.to_json());
    } else {
        // What a saved file or a remote page holds is shown, never obeyed by the terminal.
        print!("{}", terminal_safe(&done.render()));
    }
    if let Some(path) = json.filter(|_| !json_to_stdout) {
        if let Err(e) = std::fs::write(&path, format!("{:#}\n", done.to_json())) {
            return fail(format!("{}: {e}", path.display()));
        }
    }
    if let Some(path) = plot {
        let written = done
            .plot()
            .and_then(|svg| std::fs::write(&path, svg).map_err(|e| e.to_string()));
        if let Err(e) = written {
            return fail(format!("{}: {e}", path.display()));
        }
    }
    if done.measured_nothing() {
        eprintln!("llmslo sweep: no step served a request: see the notes above");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// What a sweep or a comparison measured.
enum Done {
    /// One target's curve.
    Sweep(Box<Report>),
    /// Two targets' curves and the verdict.
    Compare(Box<Comparison>),
    /// Two saved curves side by side.
    Saved(Box<SavedComparison>),
}

impl Done {
    fn render(&self) -> String {
        match self {
            Done::Sweep(report) => report.render(),
            Done::Compare(comparison) => comparison.render(),
            Done::Saved(saved) => saved.render(),
        }
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Done::Sweep(report) => report.to_json(),
            Done::Compare(comparison) => comparison.to_json(),
            Done::Saved(saved) => saved.to_json(),
        }
    }

    fn plot(&self) -> Result<String, String> {
        match self {
            Done::Sweep(report) => super::plot::render(report),
            Done::Compare(comparison) => super::plot::render_comparison(&comparison.a, &comparison.b),
            Done::Saved(saved) => super::plot::render_comparison(&saved.a, &saved.b),
        }
    }

    fn measured_nothing(&self) -> bool {
        match self {
            Done::Sweep(report) => report.measured_nothing(),
            Done::Compare(comparison) => comparison.a.measured_nothing() && comparison.b.measured_nothing(),
            Done::Saved(saved) => saved.a.measured_nothing() && saved.b.measured_nothing(),
        }
    }
}
