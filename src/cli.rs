//! The command line: `run`, `simulate` and `demo`.

use crate::config::{Config, EngineSetting, LogFormat, Overrides};
use crate::k8s::inject::{self, InjectOptions, SidecarMode};
use crate::k8s::webhook;
use crate::observe::tokens::TokenCounter;
use crate::record::Role;
use crate::sidecar::{stop_unless_interrupted_again, termination_signal, Sidecar};
use crate::slo::rules::{self, RulesFormat};
use crate::tools::bench;
use crate::tools::demo::{self, DemoOptions};
use crate::tools::simulate::batching::BatchingOptions;
use crate::tools::simulate::delay::Delay;
use crate::tools::simulate::disagg::PdOptions;
use crate::tools::simulate::shape::Flavor;
use crate::tools::simulate::{PromptCounting, SimEngine, SimOptions};
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

mod args;

use args::*;

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
            "prefill_pool",
            "tls_cert_file",
            "tls_key_file",
            "tls_self_signed",
            "upstream_ca_file",
            "upstream_insecure_skip_verify",
            "prefill_tls",
            "prefill_ca_file",
            "prefill_insecure_skip_verify",
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

/// `command` with the environment variables that are set but empty (or blank) unbound from their
/// settings: an empty variable means the default (a template that renders `LLMSLO_X=""` must
/// not stop the pod), as if it were unset.
fn without_empty_env(command: clap::Command) -> clap::Command {
    let is_empty = |arg: &clap::Arg| {
        arg.get_env()
            .and_then(std::env::var_os)
            .is_some_and(|value| value.to_str().is_some_and(|text| text.trim().is_empty()))
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
                let tls = match webhook::tls(&args.tls_cert, &args.tls_key, args.client_ca.as_deref()) {
                    Ok(tls) => tls,
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
                let tokenizer = match args.tokenizer.as_deref().map(TokenCounter::load).transpose() {
                    Ok(tokenizer) => tokenizer.map(Arc::new),
                    Err(e) => {
                        error!(error = %e, "--tokenizer: could not load it");
                        return ExitCode::FAILURE;
                    }
                };
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
                    prompt_counting: PromptCounting {
                        chars_per_token: args.chars_per_token,
                        tokenizer,
                        template_tokens: args.template_tokens,
                    },
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
                    first_port: args.first_port,
                    tls: args.tls,
                };
                match bench::run(&options).await {
                    Ok(rows) => {
                        write_stdout(&bench::render(&rows, options.proxy_workers, options.tls));
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
                    disaggregated: args.disaggregated,
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
                    engine_listen: args
                        .engine_listen
                        .unwrap_or(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
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
