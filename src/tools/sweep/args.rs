//! `llmslo sweep`'s flags, their checks, and the run from flags to table, JSON and plot.

use super::client::Endpoint;
use super::load::Bursts;
use super::{LoadPlan, SweepError, SweepOptions};
use crate::config::Config;
use crate::flags::{duration, EXIT_CONFIG};
use crate::slo::spec::SloKind;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The flags of `llmslo sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The OpenAI-compatible endpoint's base URL, e.g. http://127.0.0.1:8000 or https://llm.example.com.
    #[arg(long)]
    target: String,
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
    /// Open-loop Poisson steps instead, in requests per second (`0.5,1,2`).
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// Send each rate step's requests in bursts: ON of arrivals, then OFF of none (`2s/3s`), the same mean rate.
    #[arg(long, value_name = "ON/OFF", value_parser = bursts, requires = "rate")]
    bursts: Option<Bursts>,
    /// `--concurrency auto` goes no higher than this.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_concurrency: u64,
    /// Each step's measured window: requests sent in it are recorded.
    #[arg(long, default_value = "30s", value_parser = duration)]
    duration: Duration,
    /// Unrecorded load before each window, to reach a steady state.
    #[arg(long, default_value = "5s", value_parser = duration)]
    warmup: Duration,
    /// Length of the synthetic prompt, in tokens.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_000_000), conflicts_with = "dataset")]
    prompt_tokens: u32,
    /// Output tokens asked of every request (`max_tokens`; a dataset line's own `output_tokens` wins).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    output_tokens: u32,
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
    /// what a million output tokens cost there.
    #[arg(long, value_name = "PRICE")]
    gpu_hour_price: Option<f64>,
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
    /// Checks the flags and the SLO file and turns them into options.
    pub fn options(self) -> Result<SweepOptions, SweepError> {
        let usage = |m: String| Err(SweepError::Usage(m));
        let slos = Config::slos_from_file(&self.config).map_err(|e| SweepError::Usage(e.to_string()))?;
        let loads = if !self.rate.is_empty() {
            if let Some(bad) = self.rate.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
                return usage(format!("--rate {bad}: rates are requests per second above zero"));
            }
            LoadPlan::Rate(self.rate)
        } else {
            match self.concurrency.as_slice() {
                [] => LoadPlan::Auto {
                    max: self.max_concurrency as usize,
                },
                [auto] if auto == "auto" => LoadPlan::Auto {
                    max: self.max_concurrency as usize,
                },
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
        if let Some(price) = self.gpu_hour_price.filter(|p| !(p.is_finite() && *p > 0.0)) {
            return usage(format!("--gpu-hour-price {price}: a price above zero"));
        }
        if self.duration.is_zero() {
            return usage("--duration must be above zero".into());
        }
        if self.request_timeout.is_zero() {
            return usage("--request-timeout must be above zero".into());
        }
        let tpot_slo = slos.slos.iter().find(|s| matches!(s.kind, SloKind::Tpot(_)));
        if let (Some(slo), true) = (tpot_slo, self.output_tokens < 2) {
            return usage(format!(
                "--output-tokens {}: TPOT needs at least 2 output tokens, and SLO `{}` judges TPOT",
                self.output_tokens, slo.name
            ));
        }
        Ok(SweepOptions {
            target: self.target,
            slos,
            model: self.model,
            endpoint: self.endpoint,
            api_key: self.api_key.filter(|k| !k.is_empty()),
            loads,
            warmup: self.warmup,
            duration: self.duration,
            prompt_tokens: self.prompt_tokens,
            output_tokens: self.output_tokens,
            dataset: self.dataset,
            ignore_eos: !self.no_ignore_eos,
            request_timeout: self.request_timeout,
            ca_cert: self.ca_cert,
            seed: self.seed,
            gpu_hour_price: self.gpu_hour_price,
            bursts: self.bursts,
        })
    }
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
        eprintln!("llmslo sweep: {e}");
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
    let options = match args.options() {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    let report = match super::run(options).await {
        Ok(report) => report,
        Err(e) => return fail(e),
    };
    let json_to_stdout = json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    if json_to_stdout {
        println!("{:#}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    if let Some(path) = json.filter(|_| !json_to_stdout) {
        if let Err(e) = std::fs::write(&path, format!("{:#}\n", report.to_json())) {
            return fail(SweepError::Usage(format!("{}: {e}", path.display())));
        }
    }
    if let Some(path) = plot {
        let written =
            super::plot::render(&report).and_then(|svg| std::fs::write(&path, svg).map_err(|e| e.to_string()));
        if let Err(e) = written {
            return fail(SweepError::Usage(format!("{}: {e}", path.display())));
        }
    }
    if report.measured_nothing() {
        eprintln!("llmslo sweep: no step served a request: see the notes above");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
