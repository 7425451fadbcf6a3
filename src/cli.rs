//! The command line: `run`, `simulate` and `demo`.

use crate::config::{Config, EngineSetting, LogFormat, Overrides};
use crate::k8s::inject::{self, InjectOptions, SidecarMode};
use crate::k8s::webhook;
use crate::record::Role;
use crate::sidecar::{stop_unless_interrupted_again, termination_signal, Sidecar};
use crate::slo::rules::{self, RulesFormat};
use crate::tools::bench;
use crate::tools::demo::{self, DemoOptions};
use crate::tools::simulate::batching::BatchingOptions;
use crate::tools::simulate::delay::Delay;
use crate::tools::simulate::disagg::PdOptions;
use crate::tools::simulate::shape::Flavor;
use crate::tools::simulate::{SimEngine, SimOptions};
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::flags::{duration, probability, EXIT_CONFIG, EXIT_INTERRUPTED};

/// llmslo: measure TTFT, TPOT and tokens in front of an LLM engine and export SLOs to Prometheus.
#[derive(Debug, Parser)]
#[command(name = "llmslo", version, about)]
pub struct Cli {
    /// Log filter, e.g. `info` or `llmslo=debug`.
    #[arg(long, global = true, env = "LLMSLO_LOG")]
    log: Option<String>,
    /// Log format.
    #[arg(long, global = true, env = "LLMSLO_LOG_FORMAT", value_enum)]
    log_format: Option<LogFormat>,
    /// Threads that serve traffic; 0 or unset: one per CPU this process may use, a container's
    /// CPU limit included (a pod without a CPU limit sees every CPU of its node).
    #[arg(long, global = true, env = "LLMSLO_WORKER_THREADS", value_name = "N",
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    worker_threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
    /// The settings whose value came from the environment ([`Cli::parse_noting_sources`]).
    #[arg(skip)]
    from_env: Vec<&'static str>,
}

impl Cli {
    /// Parses the command line (exiting with clap's message on a bad one), noting which of
    /// the settings `run` and `check-config` share came from the environment, so that an
    /// error names the variable rather than the flag.
    pub fn parse_noting_sources() -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let matches = without_empty_env(Self::command()).get_matches();
        let mut cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let sub = matches.subcommand().map(|(_, m)| m);
        for key in [
            "upstream",
            "listen",
            "metrics_listen",
            "engine",
            "log",
            "log_format",
            "role",
            "prefill_relay",
        ] {
            let source = [sub, Some(&matches)]
                .into_iter()
                .flatten()
                .find(|m| m.ids().any(|id| id.as_str() == key))
                .and_then(|m| m.value_source(key));
            if source == Some(clap::parser::ValueSource::EnvVariable) {
                cli.from_env.push(key);
            }
        }
        cli
    }

    /// The number of runtime worker threads asked for, if any (0 asks for the default, as the
    /// downward API gives a container without a CPU request).
    pub fn worker_threads(&self) -> Option<usize> {
        self.worker_threads.filter(|&n| n > 0).map(usize::from)
    }
}

/// `command` with the environment variables that are set but empty unbound from their
/// settings: an empty variable means the default (a template that renders `LLMSLO_X=""` must
/// not stop the pod), as if it were unset.
fn without_empty_env(command: clap::Command) -> clap::Command {
    let is_empty = |arg: &clap::Arg| {
        arg.get_env()
            .and_then(std::env::var_os)
            .is_some_and(|value| value.is_empty())
    };
    command
        .mut_args(|arg| if is_empty(&arg) { arg.env(None::<&str>) } else { arg })
        .mut_subcommands(without_empty_env)
}

/// The worker threads tokio starts when none are asked for: one per CPU available.
fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the sidecar in front of an engine.
    Run(RunArgs),
    /// Run the built-in simulated OpenAI-compatible engine.
    Simulate(SimulateArgs),
    /// Start a simulated engine, the sidecar and a small load; print live TTFT/TPOT.
    Demo(DemoArgs),
    /// Print Prometheus recording and alerting rules for the SLOs in a config file.
    Rules(RulesArgs),
    /// Validate a config file (with flags and environment applied) and print the effective config.
    CheckConfig(CheckConfigArgs),
    /// Add the sidecar to Kubernetes YAML whose pod templates carry `llmslo.io/inject: "true"`.
    Inject(InjectArgs),
    /// Serve the MutatingAdmissionWebhook that injects the sidecar into labelled Pods.
    Webhook(WebhookArgs),
    /// Measure the proxy's overhead against no proxy and nginx, side by side.
    Bench(BenchArgs),
    /// Stream through a sidecar for a long time, sampling its memory, file descriptors and scrape latency.
    Soak(SoakArgs),
    /// Load an OpenAI-compatible endpoint step by step, judge each step against the SLOs and find the knee.
    Sweep(Box<crate::tools::sweep::args::SweepArgs>),
}

#[derive(Debug, Args)]
struct SoakArgs {
    /// Concurrent streams.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    streams: u64,
    /// How long they stream.
    #[arg(long, default_value = "10m", value_parser = duration)]
    duration: Duration,
    /// Time between samples.
    #[arg(long, default_value = "10s", value_parser = duration)]
    sample_every: Duration,
    /// Warm-up left out of the memory flatness check.
    #[arg(long, default_value = "1m", value_parser = duration)]
    settle: Duration,
    /// How long the file descriptors may take to come back once the load stops (idle pooled
    /// engine connections close after 90 s).
    #[arg(long, default_value = "2m", value_parser = duration)]
    fd_wait: Duration,
    /// Interleave every hostile-client attack with the streams (judged on the memory limit
    /// and on no legitimate request failing, instead of RSS flatness).
    #[arg(long)]
    attacks: bool,
    #[command(flatten)]
    engine: bench::EngineTiming,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Concurrent streams, one measurement each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    streams: Vec<u64>,
    /// How long each target streams at each concurrency, after the warm-up.
    #[arg(long, default_value = "10s", value_parser = duration)]
    duration: Duration,
    /// Unrecorded streaming before each measurement, to open connections.
    #[arg(long, default_value = "2s", value_parser = duration)]
    warmup: Duration,
    #[command(flatten)]
    engine: bench::EngineTiming,
    /// The nginx binary (default: `nginx` on PATH, or /usr/sbin/nginx).
    #[arg(long, conflicts_with = "without_nginx")]
    nginx: Option<PathBuf>,
    /// Leave nginx out.
    #[arg(long)]
    without_nginx: bool,
    /// A hop without measurement to measure beside llmslo, run as `PROGRAM UPSTREAM_URI
    /// LISTEN_ADDRESS`: the `plain_hop` example is llmslo's own hop, and tells what the hop
    /// costs from what the measurement adds.
    #[arg(long, value_name = "PROGRAM")]
    hop: Option<PathBuf>,
    /// Workers each proxy serves with: llmslo's and the hop's runtime threads, nginx's worker
    /// processes; the same for all, so that none has more cores than another [default: the CPUs
    /// available, as nginx's `worker_processes auto` and tokio's default].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    proxy_workers: Option<u16>,
}

#[derive(Debug, Args)]
struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// PEM certificate chain.
    #[arg(long)]
    tls_cert: PathBuf,
    /// PEM private key.
    #[arg(long)]
    tls_key: PathBuf,
    /// PEM CA certificates: only callers presenting a certificate they signed are answered
    /// (the API server, given a client certificate in its admission configuration).
    #[arg(long, value_name = "FILE")]
    client_ca: Option<PathBuf>,
    /// The sidecar image to inject (llmslo publishes none: build it from the Dockerfile).
    #[arg(long, env = "LLMSLO_IMAGE")]
    image: String,
    /// Native sidecar (init container, Kubernetes >= 1.29) or classic container.
    #[arg(long, value_enum, default_value = "native")]
    sidecar: SidecarMode,
}

#[derive(Debug, Args)]
struct InjectArgs {
    /// The YAML to read (`-` for standard input).
    #[arg(short = 'f', long = "filename", default_value = "-")]
    file: String,
    /// The sidecar image (llmslo publishes none: build it from the Dockerfile); pods may name
    /// their own with the llmslo.io/image annotation.
    #[arg(long, env = "LLMSLO_IMAGE")]
    image: Option<String>,
    /// Native sidecar (init container, Kubernetes >= 1.29) or classic container.
    #[arg(long, value_enum, default_value = "native")]
    sidecar: SidecarMode,
    /// Point the Services that target the engine's port by number (or by `llmslo-engine`) at
    /// the sidecar's port, instead of only warning about them.
    #[arg(long)]
    rewrite_services: bool,
    /// Fail, printing nothing, when a Service would bypass the sidecar or an `llmslo.io/`
    /// label or annotation is unknown, misplaced or not a string.
    #[arg(long)]
    strict: bool,
    /// Inject even when an `llmslo.io/` label or annotation is unknown or misplaced (it is
    /// then ignored); without it the command fails, printing nothing.
    #[arg(long, conflicts_with = "strict")]
    lenient: bool,
}

#[derive(Debug, Args)]
struct RulesArgs {
    /// The config file holding `slos:`.
    file: PathBuf,
    /// Output wrapping.
    #[arg(long, value_enum, default_value = "prometheus")]
    format: RulesFormat,
    /// Only this file's SLO groups, without the fleet-wide ones (goodput, capacity, GPU
    /// efficiency, sidecar health): for every SLO file after the first, so that Prometheus
    /// evaluates the fleet-wide groups once.
    #[arg(long)]
    slos_only: bool,
    /// Also record each deployment's attainment, goodput and p99 TTFT/TPOT, told apart by this
    /// label (a version label, or `rollouts_pod_template_hash`), for canary analysis.
    #[arg(long, value_name = "LABEL")]
    compare_by: Option<String>,
    /// The window of the comparing rules [default: 10m].
    #[arg(long, value_parser = crate::flags::duration, requires = "compare_by")]
    compare_window: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
struct CheckConfigArgs {
    /// The config file.
    file: PathBuf,
    #[command(flatten)]
    endpoints: Endpoints,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    endpoints: Endpoints,
    /// YAML config file (flags and environment override it).
    #[arg(long, env = "LLMSLO_CONFIG")]
    config: Option<PathBuf>,
}

/// The settings `run` takes from flags and the environment.
#[derive(Debug, Args)]
struct Endpoints {
    /// The engine's base URL, e.g. http://127.0.0.1:8000 (required: here, in LLMSLO_UPSTREAM or as `upstream:` in --config).
    #[arg(long, env = "LLMSLO_UPSTREAM")]
    upstream: Option<String>,
    /// Address the proxy listens on [default: 0.0.0.0:8080].
    #[arg(long, env = "LLMSLO_LISTEN")]
    listen: Option<String>,
    /// Address for /metrics, /healthz and /readyz [default: 0.0.0.0:9464].
    #[arg(long, env = "LLMSLO_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// The engine kind, exported as `provider`: auto, vllm, tgi, sglang, llamacpp or openai
    /// [default: auto].
    #[arg(long, env = "LLMSLO_ENGINE")]
    engine: Option<String>,
    /// The pod's role in disaggregated serving: aggregated, prefill or decode [default: aggregated].
    #[arg(long, env = "LLMSLO_ROLE")]
    role: Option<String>,
    /// Address of the prefill relay of a decode pod's sidecar, like 127.0.0.1:8299 [default: off].
    #[arg(long, env = "LLMSLO_PREFILL_RELAY")]
    prefill_relay: Option<String>,
}

impl Endpoints {
    /// The settings given by flags and the environment (`from_env` names the keys the
    /// environment gave); an unknown engine is an error that names where it came from.
    fn overrides(
        self,
        log: Option<String>,
        log_format: Option<LogFormat>,
        from_env: Vec<&'static str>,
    ) -> Result<Overrides, String> {
        let engine = match self.engine {
            None => None,
            Some(name) => Some(<EngineSetting as clap::ValueEnum>::from_str(&name, true).map_err(|_| {
                format!(
                    "{}: `{name}` is not an engine: auto, vllm, tgi, sglang, llamacpp or openai",
                    crate::config::origin_label("engine", from_env.contains(&"engine"))
                )
            })?),
        };
        let role = match self.role {
            None => None,
            Some(name) => Some(Role::from_label(&name).filter(|_| name != "both").ok_or_else(|| {
                format!(
                    "{}: `{name}` is not a role: aggregated, prefill or decode",
                    crate::config::origin_label("role", from_env.contains(&"role"))
                )
            })?),
        };
        Ok(Overrides {
            upstream: self.upstream,
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            log,
            log_format,
            engine,
            role,
            prefill_relay: self.prefill_relay,
            from_env,
        })
    }
}

#[derive(Debug, Args)]
struct SimulateArgs {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Engine to imitate (TGI adds /generate_stream, /generate and /info).
    #[arg(long, value_enum, default_value = "vllm")]
    flavor: Flavor,
    /// Output tokens streamed as `reasoning_content` before the answer.
    #[arg(long, default_value_t = 0)]
    reasoning_tokens: u32,
    /// Model names served (repeat or comma-separate).
    #[arg(long = "model", value_delimiter = ',', default_value = "sim")]
    models: Vec<String>,
    /// Time to first token: `200ms`, `uniform:100ms..300ms` or `normal:200ms,20ms`.
    #[arg(long, default_value = "200ms")]
    ttft: Delay,
    /// Time per output token, same forms as --ttft.
    #[arg(long, default_value = "30ms")]
    tpot: Delay,
    /// Tokens per content chunk.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    tokens_per_chunk: u32,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Probability (0-1) of answering HTTP 500.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    error_rate: f64,
    /// Probability (0-1) of an error payload mid-stream.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    midstream_error_rate: f64,
    /// Probability (0-1) of closing the connection mid-stream.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    abort_rate: f64,
    /// Seed for token text, timings and faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Continuous batching: one loop of decode steps shared by every request, so latency
    /// depends on load (--ttft and --tpot are then unused).
    #[arg(long)]
    batching: bool,
    /// Batching: fixed cost of a decode step.
    #[arg(long, default_value = "12ms", value_parser = duration, requires = "batching")]
    step_base: Duration,
    /// Batching: added to a step per running sequence.
    #[arg(long, default_value = "100us", value_parser = duration, requires = "batching")]
    step_per_seq: Duration,
    /// Batching: added to a step per prompt token admitted in it (prefill).
    #[arg(long, default_value = "30us", value_parser = duration, requires = "batching")]
    prefill_per_token: Duration,
    /// Batching: sequences that run at once; the rest wait in order.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=100_000), requires = "batching")]
    max_batch: u64,
    /// Batching: KV-cache budget in tokens (prompt plus output of the running sequences).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), requires = "batching")]
    kv_tokens: Option<u64>,
    /// Batching: random spread of each step's duration, 0-1: a step lasts its cost x
    /// (1 - j + j x E), E exponential with mean 1 (a noisy engine: same mean, a tail at any load).
    #[arg(long, default_value_t = 0.0, value_parser = probability, requires = "batching")]
    step_jitter: f64,
    /// State each request's own timing (queue, scheduling to first token, mean inter-token
    /// latency) beside its usage, as vLLM does with --enable-per-request-metrics.
    #[arg(long)]
    per_request_metrics: bool,
    /// Follow vLLM's kv_transfer_params as an engine of a disaggregated pair (run two: the
    /// prefill and the decode engine): a prefill leg answers where its KV blocks are, a decode
    /// leg skips the prefill and waits for the transfer (not with --batching).
    #[arg(long, conflicts_with = "batching")]
    pd: bool,
    /// With --pd: prefill time per prompt token, added to the TTFT of what prefills here.
    #[arg(long, default_value = "200us", value_parser = duration, requires = "pd")]
    pd_prefill_per_token: Duration,
    /// With --pd: KV transfer time per prompt token, waited by a decode leg.
    #[arg(long, default_value = "20us", value_parser = duration, requires = "pd")]
    pd_transfer_per_token: Duration,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Address the sidecar listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Address for the sidecar's /metrics.
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics_listen: SocketAddr,
    /// Streaming clients at the peak of the load (the knee of the demo's engine is about 23).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    concurrency: u64,
    /// One ramp of the load, from an eighth of --concurrency up to all of it and back
    /// (`0` holds it at --concurrency).
    #[arg(long, default_value = "2m", value_parser = duration)]
    ramp: Duration,
    /// Time between table prints: `5s`, `500ms`, or a number of seconds.
    #[arg(long, default_value = "5s", value_parser = duration)]
    interval: Duration,
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = duration)]
    duration: Option<Duration>,
}

impl Cli {
    /// Runs the chosen subcommand to completion.
    pub async fn run(self) -> ExitCode {
        let asked_threads = self.worker_threads();
        let worker_threads = asked_threads.unwrap_or_else(default_worker_threads);
        match self.command {
            Command::Webhook(args) => {
                init_logging(
                    self.log.as_deref().unwrap_or("info"),
                    self.log_format.unwrap_or(LogFormat::Text),
                );
                let tls = match webhook::TlsFiles::load(&args.tls_cert, &args.tls_key, args.client_ca.as_deref()) {
                    Ok(tls) => Arc::new(tls),
                    Err(e) => {
                        eprintln!("llmslo: {e}");
                        return ExitCode::from(EXIT_CONFIG);
                    }
                };
                let listener = match TcpListener::bind(args.listen).await {
                    Ok(listener) => listener,
                    Err(e) => {
                        error!(error = %e, listen = %args.listen, "could not bind");
                        return ExitCode::FAILURE;
                    }
                };
                let options = InjectOptions {
                    image: Some(args.image),
                    mode: args.sidecar,
                    rewrite_services: false,
                };
                tracing::info!(listen = %args.listen, "admission webhook serving");
                let shutdown = CancellationToken::new();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    termination_signal().await;
                    stop.cancel();
                });
                webhook::serve(listener, tls, options, shutdown).await;
                ExitCode::SUCCESS
            }
            Command::Inject(args) => {
                let input = if args.file == "-" {
                    std::io::read_to_string(std::io::stdin())
                } else {
                    std::fs::read_to_string(&args.file)
                };
                let input = match input {
                    Ok(input) => input,
                    Err(e) => {
                        eprintln!("llmslo: {}: {e}", args.file);
                        return ExitCode::FAILURE;
                    }
                };
                let options = InjectOptions {
                    image: args.image,
                    mode: args.sidecar,
                    rewrite_services: args.rewrite_services,
                };
                match inject::inject_yaml(&input, &options) {
                    Ok(injected) => {
                        for warning in &injected.warnings {
                            eprintln!("llmslo: warning: {warning}");
                        }
                        for bypass in &injected.bypasses {
                            eprintln!("llmslo: {bypass}");
                        }
                        let bypassed = injected.bypasses.iter().filter(|b| !b.rewritten).count();
                        if args.strict && bypassed + injected.warnings.len() > 0 {
                            eprintln!(
                                "llmslo: --strict: {bypassed} Service port(s) would bypass the sidecar, {} \
                                 llmslo.io/ label or annotation warning(s)",
                                injected.warnings.len()
                            );
                            return ExitCode::FAILURE;
                        }
                        if injected.unread_keys > 0 && !args.lenient {
                            eprintln!(
                                "llmslo: {} llmslo.io/ label(s) or annotation(s) llmslo would not read (above): fix \
                                 them, or pass --lenient to inject without them; nothing was written",
                                injected.unread_keys
                            );
                            return ExitCode::FAILURE;
                        }
                        write_stdout(&injected.output);
                        eprintln!("llmslo: injected {} pod template(s)", injected.changed);
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("llmslo: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Command::Rules(args) => match Config::slos_from_file(&args.file) {
                Ok(slos) => {
                    let scope = if args.slos_only {
                        rules::Scope::SlosOnly
                    } else {
                        rules::Scope::All
                    };
                    let compare =
                        match args.compare_by.as_deref().map(|l| {
                            rules::CompareBy::new(l, args.compare_window.unwrap_or(rules::DEFAULT_COMPARE_WINDOW))
                        }) {
                            Some(Err(e)) => {
                                eprintln!("llmslo rules: {e}");
                                return ExitCode::from(crate::flags::EXIT_CONFIG);
                            }
                            Some(Ok(compare)) => Some(compare),
                            None => None,
                        };
                    write_stdout(&rules::render_with(&slos, args.format, scope, compare.as_ref()));
                    for note in rules::left_out(&slos) {
                        eprintln!("llmslo: {note}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("llmslo: {e}");
                    ExitCode::from(EXIT_CONFIG)
                }
            },
            Command::CheckConfig(args) => {
                let overrides = match args.endpoints.overrides(self.log, self.log_format, self.from_env) {
                    Ok(overrides) => overrides,
                    Err(e) => {
                        eprintln!("llmslo: {e}");
                        return ExitCode::from(EXIT_CONFIG);
                    }
                };
                match Config::check(overrides, &args.file) {
                    Ok((config, upstream_given)) => {
                        for note in rules::left_out(&config.slos) {
                            eprintln!("llmslo: {note}");
                        }
                        if let Some(note) = config.tenants.fleet_note() {
                            eprintln!("llmslo: {note}");
                        }
                        let workers = worker_threads;
                        eprintln!(
                            "llmslo: worst-case memory with these limits and {workers} worker thread{}: {} MiB (keep the container's limit above it)",
                            if workers == 1 { "" } else { "s" },
                            config.worst_case_memory_bytes(workers) >> 20
                        );
                        let yaml = config.to_yaml();
                        if upstream_given {
                            write_stdout(&yaml);
                        } else {
                            // An SLO-only file (the chart's ConfigMap): everything it holds is checked.
                            let shown: String = yaml
                                .lines()
                                .filter(|line| !line.starts_with("upstream:"))
                                .map(|line| format!("{line}\n"))
                                .collect();
                            write_stdout(&shown);
                            eprintln!(
                                "llmslo: {}: valid. It names no upstream (an SLO-only file, as the chart's \
                                 ConfigMap holds), so that was not checked: `llmslo run` needs --upstream, \
                                 LLMSLO_UPSTREAM or `upstream:`",
                                args.file.display()
                            );
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("llmslo: {e}");
                        ExitCode::from(EXIT_CONFIG)
                    }
                }
            }
            Command::Run(args) => {
                let overrides = match args.endpoints.overrides(self.log, self.log_format, self.from_env) {
                    Ok(overrides) => overrides,
                    Err(e) => {
                        eprintln!("llmslo: {e}");
                        return ExitCode::from(EXIT_CONFIG);
                    }
                };
                let config = match Config::load_fail_open(overrides, args.config.as_deref()) {
                    Ok(config) => config,
                    Err(e) => {
                        eprintln!("llmslo: {e}");
                        return ExitCode::from(EXIT_CONFIG);
                    }
                };
                init_logging(&config.log, config.log_format);
                let stop = termination_signal();
                match Sidecar::start(&config).await {
                    Ok(sidecar) => {
                        stop.await;
                        if stop_unless_interrupted_again(sidecar).await {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::from(EXIT_INTERRUPTED)
                        }
                    }
                    Err(e) => {
                        error!(error = %e, "could not start the sidecar");
                        ExitCode::FAILURE
                    }
                }
            }
            Command::Simulate(args) => {
                init_logging(
                    self.log.as_deref().unwrap_or("info"),
                    self.log_format.unwrap_or(LogFormat::Text),
                );
                let listener = match TcpListener::bind(args.listen).await {
                    Ok(listener) => listener,
                    Err(e) => {
                        error!(error = %e, listen = %args.listen, "could not bind");
                        return ExitCode::FAILURE;
                    }
                };
                let engine = SimEngine::new(SimOptions {
                    flavor: args.flavor,
                    reasoning_tokens: args.reasoning_tokens,
                    models: args.models,
                    ttft: args.ttft,
                    tpot: args.tpot,
                    tokens_per_chunk: args.tokens_per_chunk,
                    default_max_tokens: args.max_tokens,
                    error_rate: args.error_rate,
                    midstream_error_rate: args.midstream_error_rate,
                    abort_rate: args.abort_rate,
                    seed: args.seed,
                    batching: args.batching.then_some(BatchingOptions {
                        step_base: args.step_base,
                        step_per_seq: args.step_per_seq,
                        prefill_per_token: args.prefill_per_token,
                        max_batch: args.max_batch as usize,
                        kv_tokens: args.kv_tokens,
                        step_jitter: args.step_jitter,
                    }),
                    per_request_metrics: args.per_request_metrics,
                    pd: args.pd.then_some(PdOptions {
                        prefill_per_token: args.pd_prefill_per_token,
                        transfer_per_token: args.pd_transfer_per_token,
                    }),
                });
                // The bound address, which `--listen 127.0.0.1:0` leaves to the system to choose.
                let listen = listener.local_addr().unwrap_or(args.listen);
                tracing::info!(%listen, "simulated engine serving");
                let shutdown = CancellationToken::new();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    termination_signal().await;
                    stop.cancel();
                });
                engine.serve(listener, shutdown).await;
                ExitCode::SUCCESS
            }
            Command::Bench(args) => {
                init_logging(
                    self.log.as_deref().unwrap_or("warn"),
                    self.log_format.unwrap_or(LogFormat::Text),
                );
                if let Some(threads) = asked_threads {
                    eprintln!(
                        "llmslo bench: --worker-threads (or LLMSLO_WORKER_THREADS) {threads} sets no proxy's threads \
                         here: every proxy bench starts serves with --proxy-workers N (llmslo's runtime threads, the \
                         hop's, nginx's worker processes)"
                    );
                    return ExitCode::from(EXIT_CONFIG);
                }
                let nginx = match (args.without_nginx, args.nginx) {
                    (true, _) => None,
                    (false, Some(path)) if path.is_file() => Some(path),
                    (false, Some(path)) => {
                        eprintln!("llmslo bench: --nginx {}: no such file", path.display());
                        return ExitCode::from(EXIT_CONFIG);
                    }
                    (false, None) => find_nginx(),
                };
                if let Some(hop) = args.hop.as_ref().filter(|hop| !hop.is_file()) {
                    eprintln!("llmslo bench: --hop {}: no such file", hop.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
                if nginx.is_none() && !args.without_nginx {
                    println!("nginx not found (apt-get install nginx, or --nginx PATH): measuring without it\n");
                }
                let options = bench::BenchOptions {
                    streams: args.streams.iter().map(|&s| s as usize).collect(),
                    warmup: args.warmup,
                    duration: args.duration,
                    engine: args.engine,
                    nginx,
                    hop: args.hop,
                    proxy_workers: args.proxy_workers.map_or_else(bench::available_cpus, usize::from),
                };
                match bench::run(&options).await {
                    Ok(rows) => {
                        write_stdout(&bench::render(&rows, options.proxy_workers));
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("llmslo bench: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Command::Soak(args) => {
                init_logging(
                    self.log.as_deref().unwrap_or("warn"),
                    self.log_format.unwrap_or(LogFormat::Text),
                );
                if args.sample_every.is_zero() || args.sample_every > args.duration {
                    eprintln!("llmslo soak: --sample-every must be above zero and at most --duration");
                    return ExitCode::from(EXIT_CONFIG);
                }
                let options = bench::soak::SoakOptions {
                    streams: args.streams as usize,
                    duration: args.duration,
                    sample_every: args.sample_every,
                    settle: args.settle,
                    fd_wait: args.fd_wait,
                    engine: args.engine,
                    attacks: args.attacks,
                };
                match bench::soak::run(&options).await {
                    Ok(report) => {
                        write_stdout(&bench::soak::render(&report));
                        if report.passed() {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::FAILURE
                        }
                    }
                    Err(e) => {
                        eprintln!("llmslo soak: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Command::Sweep(args) => {
                init_logging(
                    self.log.as_deref().unwrap_or("warn"),
                    self.log_format.unwrap_or(LogFormat::Text),
                );
                crate::tools::sweep::args::run(*args).await
            }
            Command::Demo(args) => {
                init_logging(
                    self.log.as_deref().unwrap_or("warn"),
                    self.log_format.unwrap_or(LogFormat::Text),
                );
                let options = DemoOptions {
                    listen: args.listen,
                    metrics_listen: args.metrics_listen,
                    concurrency: args.concurrency as usize,
                    ramp: args.ramp,
                    interval: args.interval,
                    duration: args.duration,
                };
                match demo::run(options).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("llmslo demo: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
        }
    }
}

/// Installs the global tracing subscriber (stderr); an invalid filter falls back to `info`.
fn init_logging(filter: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything (no-color.org).
fn use_colour(is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// `nginx` on PATH, else Debian's /usr/sbin/nginx (sbin is often not on a user's PATH).
fn find_nginx() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("nginx"));
    on_path.chain([PathBuf::from("/usr/sbin/nginx")]).find(|p| p.is_file())
}

/// Writes `text` to stdout; a reader that went away (`llmslo rules f | head`) is not an error.
fn write_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        if error.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("llmslo: cannot write the output: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_text_is_for_users() {
        use clap::CommandFactory;
        let mut command = Cli::command();
        for sub in [
            "run",
            "demo",
            "bench",
            "soak",
            "sweep",
            "simulate",
            "rules",
            "check-config",
            "inject",
            "webhook",
        ] {
            let help = command.find_subcommand_mut(sub).unwrap().render_long_help().to_string();
            assert!(!help.contains("crate::") && !help.contains("DESIGN"), "{sub}: {help}");
        }
        let top = command.render_long_help().to_string();
        assert!(!top.contains("DESIGN"), "{top}");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None), "a pod's log is not a terminal");
        assert!(!use_colour(true, Some("1".into())));
        assert!(use_colour(true, Some("".into())), "an empty NO_COLOR does not count");
    }
}
