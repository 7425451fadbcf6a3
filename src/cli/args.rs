//! The arguments of each subcommand, as clap reads them.

use super::*;

#[derive(Debug, Args)]
pub(super) struct SoakArgs {
    /// Concurrent streams.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(super) streams: u64,
    /// How long they stream.
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub(super) duration: Duration,
    /// Time between samples.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub(super) sample_every: Duration,
    /// Warm-up left out of the memory flatness check.
    #[arg(long, default_value = "1m", value_parser = duration)]
    pub(super) settle: Duration,
    /// How long the file descriptors may take to come back once the load stops (idle pooled
    /// engine connections close after 90 s).
    #[arg(long, default_value = "2m", value_parser = duration)]
    pub(super) fd_wait: Duration,
    /// Interleave every hostile-client attack with the streams (judged on the memory limit
    /// and on no legitimate request failing, instead of RSS flatness).
    #[arg(long)]
    pub(super) attacks: bool,
    /// Serve as an llm-d decode pod: the sidecar relays each stream's prefill leg through a
    /// routing sidecar (its SSRF protection on) to the engine; with --attacks, the attacks on
    /// the relay and on legs run too (judged under the 192 MiB such a pod's sidecar gets).
    #[arg(long)]
    pub(super) disaggregated: bool,
    #[command(flatten)]
    pub(super) engine: bench::EngineTiming,
}

#[derive(Debug, Args)]
pub(super) struct BenchArgs {
    /// Concurrent streams, one measurement each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(super) streams: Vec<u64>,
    /// How long each target streams at each concurrency, after the warm-up.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub(super) duration: Duration,
    /// Unrecorded streaming before each measurement, to open connections.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub(super) warmup: Duration,
    #[command(flatten)]
    pub(super) engine: bench::EngineTiming,
    /// The nginx binary (default: `nginx` on PATH, or /usr/sbin/nginx).
    #[arg(long, conflicts_with = "without_nginx")]
    pub(super) nginx: Option<PathBuf>,
    /// Leave nginx out.
    #[arg(long)]
    pub(super) without_nginx: bool,
    /// A hop without measurement to measure beside llmslo, run as `PROGRAM UPSTREAM_URI
    /// LISTEN_ADDRESS`: the `plain_hop` example is llmslo's own hop, and tells what the hop
    /// costs from what the measurement adds.
    #[arg(long, value_name = "PROGRAM", conflicts_with = "tls")]
    pub(super) hop: Option<PathBuf>,
    /// TLS on every hop, verified: the clients to each proxy and each proxy to the engine (a
    /// certificate authority made for the run), nginx with `ssl` on both sides.
    #[arg(long)]
    pub(super) tls: bool,
    /// Workers each proxy serves with: llmslo's and the hop's runtime threads, nginx's worker
    /// processes; the same for all, so that none has more cores than another [default: the CPUs
    /// available, as nginx's `worker_processes auto` and tokio's default].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(super) proxy_workers: Option<u16>,
    /// Listen on consecutive ports from this one on 127.0.0.1 (the engine, llmslo and its
    /// metrics, nginx, the hop) [default: free ports].
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub(super) first_port: Option<u16>,
}

#[derive(Debug, Args)]
pub(super) struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub(super) listen: SocketAddr,
    /// PEM certificate chain.
    #[arg(long)]
    pub(super) tls_cert: PathBuf,
    /// PEM private key.
    #[arg(long)]
    pub(super) tls_key: PathBuf,
    /// PEM CA certificates: only callers presenting a certificate they signed are answered
    /// (the API server, given a client certificate in its admission configuration).
    #[arg(long, value_name = "FILE")]
    pub(super) client_ca: Option<PathBuf>,
    /// The sidecar image to inject (llmslo publishes none: build it from the Dockerfile).
    #[arg(long, env = "LLMSLO_IMAGE")]
    pub(super) image: String,
    /// Native sidecar (init container, Kubernetes >= 1.29) or classic container.
    #[arg(long, value_enum, default_value = "native")]
    pub(super) sidecar: SidecarMode,
}

#[derive(Debug, Args)]
pub(super) struct InjectArgs {
    /// The YAML to read (`-` for standard input).
    #[arg(short = 'f', long = "filename", default_value = "-")]
    pub(super) file: String,
    /// The sidecar image (llmslo publishes none: build it from the Dockerfile); pods may name
    /// their own with the llmslo.io/image annotation.
    #[arg(long, env = "LLMSLO_IMAGE")]
    pub(super) image: Option<String>,
    /// Native sidecar (init container, Kubernetes >= 1.29) or classic container.
    #[arg(long, value_enum, default_value = "native")]
    pub(super) sidecar: SidecarMode,
    /// Point the Services that target the engine's port by number (or by `llmslo-engine`) at
    /// the sidecar's port, instead of only warning about them.
    #[arg(long)]
    pub(super) rewrite_services: bool,
    /// Fail, printing nothing, when a Service would bypass the sidecar or an `llmslo.io/`
    /// label or annotation is unknown, misplaced or not a string.
    #[arg(long)]
    pub(super) strict: bool,
    /// Inject even when an `llmslo.io/` label or annotation is unknown or misplaced (it is
    /// then ignored); without it the command fails, printing nothing.
    #[arg(long, conflicts_with = "strict")]
    pub(super) lenient: bool,
}

#[derive(Debug, Args)]
pub(super) struct RulesArgs {
    /// The config file holding `slos:`.
    pub(super) file: PathBuf,
    /// Output wrapping.
    #[arg(long, value_enum, default_value = "prometheus")]
    pub(super) format: RulesFormat,
    /// Only this file's SLO groups, without the fleet-wide ones (goodput, capacity, GPU
    /// efficiency, sidecar health): for every SLO file after the first, so that Prometheus
    /// evaluates the fleet-wide groups once.
    #[arg(long)]
    pub(super) slos_only: bool,
    /// Also record each deployment's attainment, goodput and p99 TTFT/TPOT, told apart by this
    /// label (a version label, or `rollouts_pod_template_hash`), for canary analysis.
    #[arg(long, value_name = "LABEL")]
    pub(super) compare_by: Option<String>,
    /// The window of the comparing rules [default: 10m].
    #[arg(long, value_parser = crate::flags::duration, requires = "compare_by")]
    pub(super) compare_window: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
pub(super) struct CheckConfigArgs {
    /// The config file.
    pub(super) file: PathBuf,
    #[command(flatten)]
    pub(super) endpoints: Endpoints,
}

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) endpoints: Endpoints,
    /// YAML config file (flags and environment override it).
    #[arg(long, env = "LLMSLO_CONFIG")]
    pub(super) config: Option<PathBuf>,
}

/// The settings `run` takes from flags and the environment.
#[derive(Debug, Args)]
pub(super) struct Endpoints {
    /// The engine's base URL, e.g. http://127.0.0.1:8000 (required: here, in LLMSLO_UPSTREAM or as `upstream:` in --config).
    #[arg(long, env = "LLMSLO_UPSTREAM")]
    pub(super) upstream: Option<String>,
    /// Address the proxy listens on [default: 0.0.0.0:8080].
    #[arg(long, env = "LLMSLO_LISTEN")]
    pub(super) listen: Option<String>,
    /// Address for /metrics, /healthz and /readyz [default: 0.0.0.0:9464].
    #[arg(long, env = "LLMSLO_METRICS_LISTEN")]
    pub(super) metrics_listen: Option<String>,
    /// The engine kind, exported as `provider`: auto, vllm, tgi, sglang, llamacpp or openai
    /// [default: auto].
    #[arg(long, env = "LLMSLO_ENGINE")]
    pub(super) engine: Option<String>,
    /// The pod's role in disaggregated serving: aggregated, prefill, decode, or router (in front of
    /// a P/D router) [default: aggregated].
    #[arg(long, env = "LLMSLO_ROLE")]
    pub(super) role: Option<String>,
    /// Address of the prefill relay of a decode pod's sidecar, like 127.0.0.1:8299 [default: off].
    #[arg(long, env = "LLMSLO_PREFILL_RELAY")]
    pub(super) prefill_relay: Option<String>,
    /// The prefill pods the relay may send legs to, separated by commas: a headless Service's DNS
    /// name, pod addresses or CIDR ranges, each with the port, like qwen-prefill.llm-d.svc:8000.
    #[arg(long, env = "LLMSLO_PREFILL_POOL")]
    pub(super) prefill_pool: Option<String>,
    /// Serve the proxy's port over TLS with this PEM certificate chain (and --tls-key-file);
    /// files that change are served to new connections within 10 s.
    #[arg(long, env = "LLMSLO_TLS_CERT_FILE", value_name = "FILE")]
    pub(super) tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file, PEM.
    #[arg(long, env = "LLMSLO_TLS_KEY_FILE", value_name = "FILE")]
    pub(super) tls_key_file: Option<PathBuf>,
    /// Serve the proxy's port over TLS with a certificate made at start [default: false].
    #[arg(long, env = "LLMSLO_TLS_SELF_SIGNED", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(super) tls_self_signed: Option<bool>,
    /// PEM CA certificates that verify an https upstream, instead of the public roots.
    #[arg(long, env = "LLMSLO_UPSTREAM_CA_FILE", value_name = "FILE")]
    pub(super) upstream_ca_file: Option<PathBuf>,
    /// Take an https upstream's certificate unverified: only for an engine on this host that
    /// made its own [default: false].
    #[arg(long, env = "LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(super) upstream_insecure_skip_verify: Option<bool>,
    /// The prefill relay speaks TLS: its port serves it (the proxy's certificate, else one made at
    /// start) and its legs go to the prefill pods over https [default: false].
    #[arg(long, env = "LLMSLO_PREFILL_TLS", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(super) prefill_tls: Option<bool>,
    /// PEM CA certificates that verify the prefill pods the relay sends legs to.
    #[arg(long, env = "LLMSLO_PREFILL_CA_FILE", value_name = "FILE")]
    pub(super) prefill_ca_file: Option<PathBuf>,
    /// Take the prefill pods' certificates unverified, as a routing sidecar started with
    /// --tls-insecure-skip-verify=prefiller does [default: false].
    #[arg(long, env = "LLMSLO_PREFILL_INSECURE_SKIP_VERIFY", num_args = 0..=1, default_missing_value = "true",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub(super) prefill_insecure_skip_verify: Option<bool>,
}

impl Endpoints {
    /// The settings given by flags and the environment (`from_env` names the keys the
    /// environment gave); an unknown engine is an error that names where it came from.
    pub(super) fn overrides(
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
            Some(name) => Some(Role::from_name(&name).ok_or_else(|| {
                format!(
                    "{}: `{name}` is not a role: aggregated, prefill, decode or router",
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
            prefill_pool: self.prefill_pool,
            tls_cert_file: self.tls_cert_file,
            tls_key_file: self.tls_key_file,
            tls_self_signed: self.tls_self_signed,
            upstream_ca_file: self.upstream_ca_file,
            upstream_insecure_skip_verify: self.upstream_insecure_skip_verify,
            prefill_tls: self.prefill_tls,
            prefill_ca_file: self.prefill_ca_file,
            prefill_insecure_skip_verify: self.prefill_insecure_skip_verify,
            from_env,
        })
    }
}

#[derive(Debug, Args)]
pub(super) struct SimulateArgs {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub(super) listen: SocketAddr,
    /// Engine to imitate (TGI adds /generate_stream, /generate and /info).
    #[arg(long, value_enum, default_value = "vllm")]
    pub(super) flavor: Flavor,
    /// Output tokens streamed as `reasoning_content` before the answer.
    #[arg(long, default_value_t = 0)]
    pub(super) reasoning_tokens: u32,
    /// Model names served (repeat or comma-separate).
    #[arg(long = "model", value_delimiter = ',', default_value = "sim")]
    pub(super) models: Vec<String>,
    /// Time to first token: `200ms`, `uniform:100ms..300ms` or `normal:200ms,20ms`.
    #[arg(long, default_value = "200ms")]
    pub(super) ttft: Delay,
    /// Time per output token, same forms as --ttft.
    #[arg(long, default_value = "30ms")]
    pub(super) tpot: Delay,
    /// Tokens per content chunk.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(super) tokens_per_chunk: u32,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 64)]
    pub(super) max_tokens: u32,
    /// Probability (0-1) of answering HTTP 500.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub(super) error_rate: f64,
    /// Probability (0-1) of an error payload mid-stream.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub(super) midstream_error_rate: f64,
    /// Probability (0-1) of closing the connection mid-stream.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub(super) abort_rate: f64,
    /// Seed for token text, timings and faults.
    #[arg(long, default_value_t = 0)]
    pub(super) seed: u64,
    /// Continuous batching: one loop of decode steps shared by every request, so latency
    /// depends on load (--ttft and --tpot are then unused).
    #[arg(long)]
    pub(super) batching: bool,
    /// Batching: fixed cost of a decode step.
    #[arg(long, default_value = "12ms", value_parser = duration, requires = "batching")]
    pub(super) step_base: Duration,
    /// Batching: added to a step per running sequence.
    #[arg(long, default_value = "100us", value_parser = duration, requires = "batching")]
    pub(super) step_per_seq: Duration,
    /// Batching: added to a step per prompt token admitted in it (prefill).
    #[arg(long, default_value = "30us", value_parser = duration, requires = "batching")]
    pub(super) prefill_per_token: Duration,
    /// Batching: sequences that run at once; the rest wait in order.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=100_000), requires = "batching")]
    pub(super) max_batch: u64,
    /// Batching: KV-cache budget in tokens (prompt plus output of the running sequences).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..), requires = "batching")]
    pub(super) kv_tokens: Option<u64>,
    /// Batching: random spread of each step's duration, 0-1: a step lasts its cost x
    /// (1 - j + j x E), E exponential with mean 1 (a noisy engine: same mean, a tail at any load).
    #[arg(long, default_value_t = 0.0, value_parser = probability, requires = "batching")]
    pub(super) step_jitter: f64,
    /// State each request's own timing (queue, scheduling to first token, mean inter-token
    /// latency) beside its usage, as vLLM does with --enable-per-request-metrics.
    #[arg(long)]
    pub(super) per_request_metrics: bool,
    /// The tokenizer's characters a token: the prompt tokens the usage states are the
    /// prompt's characters over this.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(super) chars_per_token: u32,
    /// Count prompt tokens with this tokenizer (a tokenizer.json, or a model directory that
    /// holds one) instead of by characters.
    #[arg(long, value_name = "PATH")]
    pub(super) tokenizer: Option<PathBuf>,
    /// Tokens a chat template adds to every prompt sent as messages (chat, Messages, a
    /// Responses input), as a model's template does.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub(super) template_tokens: u32,
    /// Follow vLLM's kv_transfer_params as an engine of a disaggregated pair (run two: the
    /// prefill and the decode engine): a prefill leg answers where its KV blocks are, a decode
    /// leg skips the prefill and waits for the transfer (not with --batching).
    #[arg(long, conflicts_with = "batching")]
    pub(super) pd: bool,
    /// With --pd: prefill time per prompt token, added to the TTFT of what prefills here.
    #[arg(long, default_value = "200us", value_parser = duration, requires = "pd")]
    pub(super) pd_prefill_per_token: Duration,
    /// With --pd: KV transfer time per prompt token, waited by a decode leg.
    #[arg(long, default_value = "20us", value_parser = duration, requires = "pd")]
    pub(super) pd_transfer_per_token: Duration,
}

#[derive(Debug, Args)]
pub(super) struct DemoArgs {
    /// Address the sidecar listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(super) listen: SocketAddr,
    /// Address for the sidecar's /metrics.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub(super) metrics_listen: SocketAddr,
    /// Address of the simulated engine [default: a free port on 127.0.0.1].
    #[arg(long)]
    pub(super) engine_listen: Option<SocketAddr>,
    /// Streaming clients at the peak of the load (the knee of the demo's engine is about 23).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(super) concurrency: u64,
    /// One ramp of the load, from an eighth of --concurrency up to all of it and back
    /// (`0` holds it at --concurrency).
    #[arg(long, default_value = "2m", value_parser = duration)]
    pub(super) ramp: Duration,
    /// Time between table prints: `5s`, `500ms`, or a number of seconds.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub(super) interval: Duration,
    /// Stop after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = duration)]
    pub(super) duration: Option<Duration>,
}
