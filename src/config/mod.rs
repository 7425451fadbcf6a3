//! Typed, validated configuration from flags, environment and a YAML file
//! (precedence: flag > environment > file > default).

mod locate;
pub mod memory;

use crate::engine::EngineMetricsMode;
use crate::metrics::buckets::BucketOverrides;
use crate::otel::settings::{OtelConfig, OtelSettings, SettingError};
use crate::record::Engine;
use crate::slo::spec::{GoodputEntry, SloEntry, SloFile, SloSet};
use http::Uri;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A configuration problem; its message names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file named by `--config` / `LLMSLO_CONFIG`.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid YAML for the schema (serde names the key and line).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What serde_yaml said, which names the key and its line.
        message: String,
    },
    /// A value in the config file is out of range or malformed, at this line.
    #[error("{}:{line}: config key `{key}`: {message}", path.display())]
    InvalidAt {
        /// The file.
        path: PathBuf,
        /// The 1-based line of the key.
        line: usize,
        /// The offending key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value given by a flag or an environment variable is out of range or malformed.
    #[error("{origin}: {message}")]
    InvalidGiven {
        /// `flag --listen` or `environment variable LLMSLO_LISTEN`.
        origin: String,
        /// The key the value stands for.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("config key `{key}`: {message}")]
    Invalid {
        /// The offending key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    /// The key an invalid value was given for, when the error is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. }
            | ConfigError::InvalidAt { key, .. }
            | ConfigError::InvalidGiven { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Places an invalid value's key in the file it came from, when the key is written there.
    fn located(self, path: &Path, text: &str) -> Self {
        match self {
            ConfigError::Invalid { key, message } => match locate::line_of(text, &key) {
                Some(line) => ConfigError::InvalidAt {
                    path: path.to_path_buf(),
                    line,
                    key,
                    message,
                },
                None => ConfigError::Invalid { key, message },
            },
            other => other,
        }
    }

    /// Names the flag or environment variable an invalid value came from, when one did.
    fn given_by(self, overrides: &Overrides) -> Self {
        match self {
            ConfigError::Invalid { key, message } => match overrides.origin(&key) {
                Some(origin) => ConfigError::InvalidGiven { origin, key, message },
                None => ConfigError::Invalid { key, message },
            },
            other => other,
        }
    }

    fn invalid(key: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The engine behind the sidecar, exported as the `provider` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EngineSetting {
    /// Learn it from the upstream's answers (/v1/models, /info, response headers).
    Auto,
    /// vLLM.
    Vllm,
    /// Text Generation Inference.
    Tgi,
    /// SGLang.
    Sglang,
    /// llama.cpp server.
    Llamacpp,
    /// Any other OpenAI-compatible engine.
    Openai,
}

impl EngineSetting {
    /// The configured engine, or `None` for `auto`.
    pub fn fixed(self) -> Option<Engine> {
        match self {
            EngineSetting::Auto => None,
            EngineSetting::Vllm => Some(Engine::Vllm),
            EngineSetting::Tgi => Some(Engine::Tgi),
            EngineSetting::Sglang => Some(Engine::Sglang),
            EngineSetting::Llamacpp => Some(Engine::Llamacpp),
            EngineSetting::Openai => Some(Engine::Openai),
        }
    }
}

/// Values given on the command line or in the environment (clap resolves flag > env).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--upstream` / `LLMSLO_UPSTREAM`.
    pub upstream: Option<String>,
    /// `--listen` / `LLMSLO_LISTEN`.
    pub listen: Option<String>,
    /// `--metrics-listen` / `LLMSLO_METRICS_LISTEN`.
    pub metrics_listen: Option<String>,
    /// `--log` / `LLMSLO_LOG`.
    pub log: Option<String>,
    /// `--log-format` / `LLMSLO_LOG_FORMAT`.
    pub log_format: Option<LogFormat>,
    /// `--engine` / `LLMSLO_ENGINE`.
    pub engine: Option<EngineSetting>,
    /// The keys above whose value came from the environment rather than a flag.
    pub from_env: Vec<&'static str>,
}

impl Overrides {
    /// Where the value of `key` came from: its flag, its environment variable, or (when
    /// neither gave it) `None`, the file or the default.
    fn origin(&self, key: &str) -> Option<String> {
        let given = match key {
            "upstream" => self.upstream.is_some(),
            "listen" => self.listen.is_some(),
            "metrics_listen" => self.metrics_listen.is_some(),
            "log" => self.log.is_some(),
            "log_format" => self.log_format.is_some(),
            "engine" => self.engine.is_some(),
            _ => false,
        };
        given.then(|| origin_label(key, self.from_env.contains(&key)))
    }
}

/// `flag --metrics-listen` or `environment variable LLMSLO_METRICS_LISTEN`.
pub fn origin_label(key: &str, from_env: bool) -> String {
    if from_env {
        format!("environment variable LLMSLO_{}", key.to_ascii_uppercase())
    } else {
        format!("flag --{}", key.replace('_', "-"))
    }
}

/// The YAML file's schema; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    upstream: Option<String>,
    listen: Option<String>,
    metrics_listen: Option<String>,
    log: Option<String>,
    log_format: Option<LogFormat>,
    engine: Option<EngineSetting>,
    inject_usage: Option<bool>,
    models: Option<Vec<String>>,
    max_models: Option<usize>,
    max_peek_bytes: Option<usize>,
    max_body_bytes: Option<u64>,
    max_buffered_request_bytes: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    request_body_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    request_body_total_timeout: Option<Duration>,
    request_body_min_rate: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    send_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    connection_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    http2_keep_alive_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    http2_keep_alive_timeout: Option<Duration>,
    max_connections: Option<usize>,
    max_streams_per_connection: Option<u32>,
    max_in_flight_requests: Option<usize>,
    max_event_bytes: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    upstream_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    stream_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    drain_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    final_scrape_grace: Option<Duration>,
    health_path: Option<String>,
    #[serde(default, with = "humantime_serde")]
    health_interval: Option<Duration>,
    engine_metrics: Option<EngineMetricsMode>,
    engine_metrics_path: Option<String>,
    #[serde(default, with = "humantime_serde")]
    engine_metrics_interval: Option<Duration>,
    engine_metrics_max_samples: Option<usize>,
    tokenizer: Option<PathBuf>,
    buckets: Option<BucketOverrides>,
    service: Option<String>,
    #[serde(default, with = "humantime_serde")]
    period: Option<Duration>,
    min_events: Option<u64>,
    #[serde(default)]
    slos: Vec<SloEntry>,
    goodput: Option<GoodputEntry>,
    gpu: Option<GpuFile>,
    capacity: Option<CapacityFile>,
    otel: Option<OtelConfig>,
}

/// `capacity:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapacityFile {
    #[serde(default, with = "humantime_serde")]
    window: Option<Duration>,
}

/// `gpu:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuFile {
    enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    interval: Option<Duration>,
    library_path: Option<String>,
    processes: Option<bool>,
    simulated: Option<bool>,
}

/// GPU sampling settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSettings {
    /// `gpu.enabled`: `false` turns GPU telemetry off entirely.
    pub enabled: bool,
    /// `gpu.interval`: time between samples.
    pub interval: Duration,
    /// `gpu.library_path`: the NVML library to load.
    pub library_path: String,
    /// `gpu.processes`: export per-process GPU memory.
    pub processes: bool,
    /// `gpu.simulated`: export one simulated GPU instead of reading NVML (demos, dashboards).
    pub simulated: bool,
}

/// The effective, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The engine's base URI (`http://host:port`).
    pub upstream: Uri,
    /// Where the proxy listens.
    pub listen: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_listen: SocketAddr,
    /// The tracing filter (`info`, `llmslo=debug`, ...).
    pub log: String,
    /// Log line format.
    pub log_format: LogFormat,
    /// The engine kind, exported as `provider` (`auto` learns it).
    pub engine: EngineSetting,
    /// Ask streaming OpenAI requests for usage when they did not, and hide the answer.
    pub inject_usage: bool,
    /// Model allow-list; empty learns up to `max_models`.
    pub models: Vec<String>,
    /// Distinct model label values learned before the rest become `other`.
    pub max_models: usize,
    /// Bytes of a generation request read to learn `model` and `stream`.
    pub max_peek_bytes: usize,
    /// Largest generation request body (413 beyond it).
    pub max_body_bytes: u64,
    /// Request bytes buffered by the peek at once, across all requests (503 beyond it).
    pub max_buffered_request_bytes: usize,
    /// Longest gap between two reads of a request body (408 beyond it).
    pub request_body_timeout: Duration,
    /// Longest a whole request body may take to arrive, counted from its head (408 beyond it).
    pub request_body_total_timeout: Duration,
    /// Slowest a request body may arrive, in bytes per second averaged from its head, once its
    /// first `request_body_timeout` has passed (408 below it); 0 turns the floor off.
    pub request_body_min_rate: u64,
    /// Longest a write to a client may wait for the client to read, and longest a response
    /// frame may wait for the client to take it (an HTTP/2 window kept shut): the connection
    /// is closed, or the stream reset, beyond it, and the engine's request with it.
    pub send_timeout: Duration,
    /// A client connection with no request open for this long is closed (both protocols).
    pub connection_idle_timeout: Duration,
    /// Silence from an HTTP/2 client after which it is sent a PING.
    pub http2_keep_alive_interval: Duration,
    /// How long that PING's answer may take before the connection is closed.
    pub http2_keep_alive_timeout: Duration,
    /// Client connections open at once on the proxy port (503 and close beyond it).
    pub max_connections: usize,
    /// Concurrent streams one HTTP/2 connection may open (advertised in its SETTINGS).
    pub max_streams_per_connection: u32,
    /// Requests forwarded at once, over all connections and protocols (503 beyond it); each
    /// holds at most one engine connection.
    pub max_in_flight_requests: usize,
    /// Largest stream event (or JSON response) interpreted.
    pub max_event_bytes: usize,
    /// How long the engine may take to send a response head (then 504).
    pub upstream_timeout: Duration,
    /// Longest silence of the engine within a response body (then `timeout`); `None` is off.
    pub stream_idle_timeout: Option<Duration>,
    /// How long in-flight streams may finish after SIGTERM.
    pub drain_timeout: Duration,
    /// How long `/metrics` stays up after the drain, for a scrape to read the final counts (it
    /// stops at the first scrape after the drain ends).
    pub final_scrape_grace: Duration,
    /// The engine's health path, probed for `/readyz`.
    pub health_path: String,
    /// How often the health path is probed.
    pub health_interval: Duration,
    /// What llmslo does with the engine's `/metrics`: `off`, `map` or `merge`.
    pub engine_metrics: EngineMetricsMode,
    /// The engine's metrics path.
    pub engine_metrics_path: String,
    /// How often the engine's metrics are read.
    pub engine_metrics_interval: Duration,
    /// Most samples (and families) read from one engine page; a longer page is refused whole.
    pub engine_metrics_max_samples: usize,
    /// The model's `tokenizer.json` (or its directory), to count tokens of streams that state none.
    pub tokenizer: Option<PathBuf>,
    /// Per-family histogram bucket overrides.
    pub buckets: BucketOverrides,
    /// The SLOs and goodput definition.
    pub slos: SloSet,
    /// GPU telemetry.
    pub gpu: GpuSettings,
    /// `capacity.window`: how far back the live capacity model looks.
    pub capacity_window: Duration,
    /// `otel:`: OTLP export, under the `OTEL_*` variables.
    pub otel: OtelConfig,
    /// The file it was read from, re-read on reload.
    pub file: Option<PathBuf>,
    /// The flags and environment it was merged with, applied again on reload.
    pub overrides: Overrides,
    /// Why the file could not be used, when this config runs without it (see
    /// [`Config::load_fail_open`]).
    pub file_error: Option<String>,
}

/// Stands in for the upstream while `check` validates a file that names none; never printed.
const CHECK_PLACEHOLDER_UPSTREAM: &str = "http://127.0.0.1:1";

/// Defaults for every key.
pub mod defaults {
    use std::time::Duration;
    /// `listen`.
    pub const LISTEN: &str = "0.0.0.0:8080";
    /// `metrics_listen`.
    pub const METRICS_LISTEN: &str = "0.0.0.0:9464";
    /// `log`.
    pub const LOG: &str = "info";
    /// `max_models`.
    pub const MAX_MODELS: usize = 16;
    /// `inject_usage`: streams are asked for their usage chunk, so token counts are exact.
    pub const INJECT_USAGE: bool = true;
    /// `max_peek_bytes`: 4 MiB.
    pub const MAX_PEEK_BYTES: usize = 4 << 20;
    /// `max_body_bytes`: 64 MiB, room for multimodal requests with inline images.
    pub const MAX_BODY_BYTES: u64 = 64 << 20;
    /// `max_buffered_request_bytes`: 16 MiB, four of the largest peeks at once.
    pub const MAX_BUFFERED_REQUEST_BYTES: usize = 16 << 20;
    /// `request_body_timeout`.
    pub const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(30);
    /// `request_body_total_timeout`: a 64 MiB body at 2 Mbit/s still arrives.
    pub const REQUEST_BODY_TOTAL_TIMEOUT: Duration = Duration::from_secs(300);
    /// `request_body_min_rate`, bytes per second: a trickle far below any real uplink.
    pub const REQUEST_BODY_MIN_RATE: u64 = 1024;
    /// `send_timeout`.
    pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
    /// `connection_idle_timeout`: as an HTTP/1.1 keep-alive connection waits for its next head.
    pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// `http2_keep_alive_interval`.
    pub const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
    /// `http2_keep_alive_timeout`.
    pub const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
    /// `max_connections`.
    pub const MAX_CONNECTIONS: usize = 2048;
    /// `max_streams_per_connection`.
    pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;
    /// `max_in_flight_requests`.
    pub const MAX_IN_FLIGHT_REQUESTS: usize = 1024;
    /// `max_event_bytes`: 1 MiB.
    pub const MAX_EVENT_BYTES: usize = 1 << 20;
    /// `upstream_timeout`.
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(600);
    /// `stream_idle_timeout`: engines do hang; a healthy one is never this quiet.
    pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// `drain_timeout`.
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
    /// `final_scrape_grace`: the chart's and the manifests' scrape interval.
    pub const FINAL_SCRAPE_GRACE: Duration = Duration::from_secs(15);
    /// `engine_metrics_max_samples`: a vLLM page has about 1,000; each kept sample costs about
    /// 150 bytes.
    pub const ENGINE_METRICS_MAX_SAMPLES: usize = 20_000;
    /// `health_path`.
    pub const HEALTH_PATH: &str = "/health";
    /// `health_interval`.
    pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
    /// `engine_metrics_path`.
    pub const ENGINE_METRICS_PATH: &str = "/metrics";
    /// `engine_metrics_interval`.
    pub const ENGINE_METRICS_INTERVAL: Duration = Duration::from_secs(5);
    /// The longest one read of the engine's metrics may take.
    pub const ENGINE_METRICS_TIMEOUT: Duration = Duration::from_secs(2);
    /// The largest engine metrics page read.
    pub const ENGINE_METRICS_MAX_BYTES: usize = 4 << 20;
}

impl Config {
    /// Merges flags/env over the optional file over defaults, and validates the result.
    pub fn load(overrides: Overrides, file: Option<&Path>) -> Result<Self, ConfigError> {
        match file {
            Some(path) => Self::from_file(overrides, path, false).map(|(config, _)| config),
            None => Self::merge(overrides, FileConfig::default()),
        }
    }

    /// [`Config::load`], except that a file that cannot be used does not stop the sidecar:
    /// the flags, the environment and the defaults run without it (no SLOs), with the file's
    /// `upstream`, `listen` and `metrics_listen` kept when they can still be read, and
    /// [`Config::file_error`] says why. Only what makes forwarding impossible (no usable
    /// upstream or listen address) is an error. The file is still watched for a fixed version.
    pub fn load_fail_open(overrides: Overrides, file: Option<&Path>) -> Result<Self, ConfigError> {
        let error = match Self::load(overrides.clone(), file) {
            Ok(config) => return Ok(config),
            Err(error) => error,
        };
        let Some(path) = file else {
            return Err(error);
        };
        let forwarding = forwarding_keys(path);
        let mut fallback_overrides = overrides.clone();
        fallback_overrides.upstream = overrides.upstream.clone().or(forwarding.upstream);
        fallback_overrides.listen = overrides.listen.clone().or(forwarding.listen);
        fallback_overrides.metrics_listen = overrides.metrics_listen.clone().or(forwarding.metrics_listen);
        match Self::merge(fallback_overrides, FileConfig::default()) {
            Ok(mut fallback) => {
                fallback.file = Some(path.to_path_buf());
                fallback.overrides = overrides;
                fallback.file_error = Some(error.to_string());
                Ok(fallback)
            }
            Err(_) => Err(error),
        }
    }

    /// Validates `file` as `check-config` does: a file without an upstream (an SLO-only file,
    /// as the chart's ConfigMap holds) is checked for everything it does hold. Returns the
    /// effective config and whether an upstream was given.
    pub fn check(overrides: Overrides, file: &Path) -> Result<(Self, bool), ConfigError> {
        Self::from_file(overrides, file, true)
    }

    /// `path` merged under `overrides`, its errors placed at their lines; with
    /// `upstream_optional`, a missing upstream is stood in for. Also says whether one was given.
    fn from_file(mut overrides: Overrides, path: &Path, upstream_optional: bool) -> Result<(Self, bool), ConfigError> {
        let (file_config, text) = read_file(path)?;
        let upstream_given = overrides.upstream.is_some() || file_config.upstream.is_some();
        if upstream_optional && !upstream_given {
            overrides.upstream = Some(CHECK_PLACEHOLDER_UPSTREAM.to_string());
        }
        let mut config = Self::merge(overrides, file_config).map_err(|e| e.located(path, &text))?;
        config.file = Some(path.to_path_buf());
        Ok((config, upstream_given))
    }

    /// Reads the same file again with the same flags and environment.
    pub fn reload(&self) -> Result<Self, ConfigError> {
        Self::load(self.overrides.clone(), self.file.as_deref())
    }

    /// Only the SLO part of a config file (for `llmslo rules`: no upstream needed).
    pub fn slos_from_file(path: &Path) -> Result<SloSet, ConfigError> {
        let (mut file, text) = read_file(path)?;
        slo_set(&mut file).map_err(|e| e.located(path, &text))
    }

    /// Builds the configuration from YAML text alone (no flags or environment).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let inline = Path::new("<inline>");
        let file = parse_yaml(text).map_err(|message| ConfigError::Parse {
            path: inline.to_path_buf(),
            message,
        })?;
        Self::merge(Overrides::default(), file).map_err(|e| e.located(inline, text))
    }

    fn merge(o: Overrides, f: FileConfig) -> Result<Self, ConfigError> {
        let overrides = o.clone();
        Self::merge_unlabelled(o, f).map_err(|e| e.given_by(&overrides))
    }

    fn merge_unlabelled(o: Overrides, mut f: FileConfig) -> Result<Self, ConfigError> {
        let slos = slo_set(&mut f)?;
        let overrides = o.clone();
        let upstream = o.upstream.or(f.upstream).ok_or_else(|| {
            ConfigError::invalid(
                "upstream",
                "required: give --upstream, LLMSLO_UPSTREAM or `upstream:` in the file",
            )
        })?;
        let config = Config {
            upstream: parse_upstream(&upstream)?,
            listen: parse_addr("listen", o.listen.or(f.listen).as_deref().unwrap_or(defaults::LISTEN))?,
            metrics_listen: parse_addr(
                "metrics_listen",
                o.metrics_listen
                    .or(f.metrics_listen)
                    .as_deref()
                    .unwrap_or(defaults::METRICS_LISTEN),
            )?,
            log: o.log.or(f.log).unwrap_or_else(|| defaults::LOG.to_string()),
            log_format: o.log_format.or(f.log_format).unwrap_or(LogFormat::Text),
            engine: o.engine.or(f.engine).unwrap_or(EngineSetting::Auto),
            inject_usage: f.inject_usage.unwrap_or(defaults::INJECT_USAGE),
            models: f.models.unwrap_or_default(),
            max_models: f.max_models.unwrap_or(defaults::MAX_MODELS),
            max_peek_bytes: f.max_peek_bytes.unwrap_or(defaults::MAX_PEEK_BYTES),
            max_body_bytes: f.max_body_bytes.unwrap_or(defaults::MAX_BODY_BYTES),
            max_buffered_request_bytes: f
                .max_buffered_request_bytes
                .unwrap_or(defaults::MAX_BUFFERED_REQUEST_BYTES),
            request_body_timeout: f.request_body_timeout.unwrap_or(defaults::REQUEST_BODY_TIMEOUT),
            request_body_total_timeout: f
                .request_body_total_timeout
                .unwrap_or(defaults::REQUEST_BODY_TOTAL_TIMEOUT),
            request_body_min_rate: f.request_body_min_rate.unwrap_or(defaults::REQUEST_BODY_MIN_RATE),
            send_timeout: f.send_timeout.unwrap_or(defaults::SEND_TIMEOUT),
            connection_idle_timeout: f.connection_idle_timeout.unwrap_or(defaults::CONNECTION_IDLE_TIMEOUT),
            http2_keep_alive_interval: f
                .http2_keep_alive_interval
                .unwrap_or(defaults::HTTP2_KEEP_ALIVE_INTERVAL),
            http2_keep_alive_timeout: f.http2_keep_alive_timeout.unwrap_or(defaults::HTTP2_KEEP_ALIVE_TIMEOUT),
            max_connections: f.max_connections.unwrap_or(defaults::MAX_CONNECTIONS),
            max_streams_per_connection: f
                .max_streams_per_connection
                .unwrap_or(defaults::MAX_STREAMS_PER_CONNECTION),
            max_in_flight_requests: f.max_in_flight_requests.unwrap_or(defaults::MAX_IN_FLIGHT_REQUESTS),
            max_event_bytes: f.max_event_bytes.unwrap_or(defaults::MAX_EVENT_BYTES),
            upstream_timeout: f.upstream_timeout.unwrap_or(defaults::UPSTREAM_TIMEOUT),
            stream_idle_timeout: Some(f.stream_idle_timeout.unwrap_or(defaults::STREAM_IDLE_TIMEOUT))
                .filter(|d| !d.is_zero()),
            drain_timeout: f.drain_timeout.unwrap_or(defaults::DRAIN_TIMEOUT),
            final_scrape_grace: f.final_scrape_grace.unwrap_or(defaults::FINAL_SCRAPE_GRACE),
            health_path: f.health_path.unwrap_or_else(|| defaults::HEALTH_PATH.to_string()),
            health_interval: f.health_interval.unwrap_or(defaults::HEALTH_INTERVAL),
            engine_metrics: f.engine_metrics.unwrap_or_default(),
            engine_metrics_path: f
                .engine_metrics_path
                .unwrap_or_else(|| defaults::ENGINE_METRICS_PATH.to_string()),
            engine_metrics_interval: f.engine_metrics_interval.unwrap_or(defaults::ENGINE_METRICS_INTERVAL),
            engine_metrics_max_samples: f
                .engine_metrics_max_samples
                .unwrap_or(defaults::ENGINE_METRICS_MAX_SAMPLES),
            tokenizer: f.tokenizer,
            buckets: f.buckets.unwrap_or_default(),
            slos,
            gpu: {
                let g = f.gpu.unwrap_or_default();
                GpuSettings {
                    enabled: g.enabled.unwrap_or(true),
                    interval: g.interval.unwrap_or(Duration::from_secs(1)),
                    library_path: g
                        .library_path
                        .unwrap_or_else(|| crate::gpu::nvml::DEFAULT_LIBRARY.to_string()),
                    processes: g.processes.unwrap_or(false),
                    simulated: g.simulated.unwrap_or(false),
                }
            },
            capacity_window: f
                .capacity
                .and_then(|c| c.window)
                .unwrap_or(crate::capacity::DEFAULT_WINDOW),
            otel: f.otel.unwrap_or_default(),
            file: None,
            file_error: None,
            overrides,
        };
        config.validate()?;
        Ok(config)
    }

    /// OTLP export as the `otel:` keys and the `OTEL_*` variables set it.
    pub fn otel_settings(&self) -> Result<OtelSettings, SettingError> {
        OtelSettings::resolve(&self.otel, |name| std::env::var(name).ok())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if tracing_subscriber::EnvFilter::try_new(&self.log).is_err() {
            return Err(ConfigError::invalid(
                "log",
                format!("`{}` is not a valid log filter", self.log),
            ));
        }
        if self.max_models == 0 {
            return Err(ConfigError::invalid("max_models", "must be at least 1"));
        }
        if self.models.iter().any(|m| m.is_empty()) {
            return Err(ConfigError::invalid("models", "model names must not be empty"));
        }
        if !(1..=(64 << 20)).contains(&self.max_peek_bytes) {
            return Err(ConfigError::invalid(
                "max_peek_bytes",
                "must be between 1 byte and 64 MiB",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(ConfigError::invalid("max_body_bytes", "must be at least 1 byte"));
        }
        if self.max_buffered_request_bytes < self.max_peek_bytes || self.max_buffered_request_bytes > u32::MAX as usize
        {
            return Err(ConfigError::invalid(
                "max_buffered_request_bytes",
                format!(
                    "must be at least max_peek_bytes ({}), or no request of that size could ever be read, \
                     and at most 4 GiB",
                    self.max_peek_bytes
                ),
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid("max_connections", "must be at least 1"));
        }
        if self.max_streams_per_connection == 0 {
            return Err(ConfigError::invalid("max_streams_per_connection", "must be at least 1"));
        }
        if self.max_in_flight_requests == 0 {
            return Err(ConfigError::invalid("max_in_flight_requests", "must be at least 1"));
        }
        if self.request_body_total_timeout < self.request_body_timeout {
            return Err(ConfigError::invalid(
                "request_body_total_timeout",
                "must be at least request_body_timeout (the longest gap between two reads)",
            ));
        }
        if !(1024..=(64 << 20)).contains(&self.max_event_bytes) {
            return Err(ConfigError::invalid(
                "max_event_bytes",
                "must be between 1 KiB and 64 MiB",
            ));
        }
        for (key, value) in [
            ("upstream_timeout", self.upstream_timeout),
            ("request_body_timeout", self.request_body_timeout),
            ("request_body_total_timeout", self.request_body_total_timeout),
            ("send_timeout", self.send_timeout),
            ("connection_idle_timeout", self.connection_idle_timeout),
            ("http2_keep_alive_interval", self.http2_keep_alive_interval),
            ("http2_keep_alive_timeout", self.http2_keep_alive_timeout),
            ("drain_timeout", self.drain_timeout),
            ("health_interval", self.health_interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::invalid(key, "must be longer than zero"));
            }
        }
        if let Err(error) = self.otel_settings() {
            return Err(ConfigError::invalid(&error.key, error.reason));
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&self.gpu.interval) {
            return Err(ConfigError::invalid("gpu.interval", "must be between 100ms and 1h"));
        }
        if !(Duration::from_secs(60)..=Duration::from_secs(24 * 3600)).contains(&self.capacity_window) {
            return Err(ConfigError::invalid(
                "capacity.window",
                "must be between 1m and 24h (the model needs minutes of traffic, and its memory is bounded)",
            ));
        }
        if self.gpu.library_path.is_empty() {
            return Err(ConfigError::invalid("gpu.library_path", "must name a library"));
        }
        if let Some(path) = &self.tokenizer {
            let file = if path.is_dir() {
                path.join("tokenizer.json")
            } else {
                path.clone()
            };
            if !file.is_file() {
                return Err(ConfigError::invalid(
                    "tokenizer",
                    format!(
                        "{} is not a file (name a tokenizer.json or the model directory holding one)",
                        file.display()
                    ),
                ));
            }
        }
        if !self.health_path.starts_with('/') {
            return Err(ConfigError::invalid("health_path", "must start with `/`"));
        }
        if !self.engine_metrics_path.starts_with('/') {
            return Err(ConfigError::invalid("engine_metrics_path", "must start with `/`"));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&self.engine_metrics_interval) {
            return Err(ConfigError::invalid(
                "engine_metrics_interval",
                "must be between 1s and 1h (each read costs the engine a page)",
            ));
        }
        if !(100..=1_000_000).contains(&self.engine_metrics_max_samples) {
            return Err(ConfigError::invalid(
                "engine_metrics_max_samples",
                "must be between 100 and 1000000 (each kept sample costs memory)",
            ));
        }
        if self.final_scrape_grace > Duration::from_secs(600) {
            return Err(ConfigError::invalid(
                "final_scrape_grace",
                "must be at most 10m (it delays the pod's exit)",
            ));
        }
        self.buckets
            .validate()
            .map_err(|(key, message)| ConfigError::invalid(&key, message))
    }
}

impl Config {
    /// The effective configuration as YAML, for `llmslo check-config`.
    pub fn to_yaml(&self) -> String {
        use crate::slo::spec::SloKind;
        let human = |d: Duration| humantime::format_duration(d).to_string();
        let slos: Vec<serde_yaml::Value> = self
            .slos
            .slos
            .iter()
            .map(|slo| {
                let mut entry = serde_yaml::Mapping::new();
                entry.insert("name".into(), slo.name.clone().into());
                entry.insert("objective".into(), slo.objective_percent().into());
                let (key, value): (&str, serde_yaml::Value) = match slo.kind {
                    SloKind::Ttft(d) => ("ttft", human(d).into()),
                    SloKind::AnswerTtft(d) => ("answer_ttft", human(d).into()),
                    SloKind::Tpot(d) => ("tpot", human(d).into()),
                    SloKind::E2e(d) => ("e2e", human(d).into()),
                    SloKind::Availability => ("availability", true.into()),
                };
                entry.insert(key.into(), value);
                if let Some(max) = slo.prompt.max_prompt_tokens {
                    entry.insert("max_prompt_tokens".into(), max.into());
                }
                if !slo.prompt.per_1k_prompt_tokens.is_zero() {
                    entry.insert(
                        "per_1k_prompt_tokens".into(),
                        human(slo.prompt.per_1k_prompt_tokens).into(),
                    );
                }
                if !slo.runbook_url.is_empty() {
                    entry.insert("runbook_url".into(), slo.runbook_url.clone().into());
                }
                entry.into()
            })
            .collect();
        let require: Vec<serde_yaml::Value> = self
            .slos
            .goodput_require
            .iter()
            .map(|&i| self.slos.slos[i].name.clone().into())
            .collect();
        let engine = match self.engine.fixed() {
            Some(engine) => engine.as_str(),
            None => "auto",
        };
        let value = serde_json::json!({
            "upstream": self.upstream.to_string(),
            "listen": self.listen.to_string(),
            "metrics_listen": self.metrics_listen.to_string(),
            "log": self.log,
            "log_format": match self.log_format { LogFormat::Text => "text", LogFormat::Json => "json" },
            "engine": engine,
            "inject_usage": self.inject_usage,
            "models": self.models,
            "max_models": self.max_models,
            "max_peek_bytes": self.max_peek_bytes,
            "max_body_bytes": self.max_body_bytes,
            "max_buffered_request_bytes": self.max_buffered_request_bytes,
            "request_body_timeout": human(self.request_body_timeout),
            "request_body_total_timeout": human(self.request_body_total_timeout),
            "request_body_min_rate": self.request_body_min_rate,
            "send_timeout": human(self.send_timeout),
            "connection_idle_timeout": human(self.connection_idle_timeout),
            "http2_keep_alive_interval": human(self.http2_keep_alive_interval),
            "http2_keep_alive_timeout": human(self.http2_keep_alive_timeout),
            "max_connections": self.max_connections,
            "max_streams_per_connection": self.max_streams_per_connection,
            "max_in_flight_requests": self.max_in_flight_requests,
            "max_event_bytes": self.max_event_bytes,
            "upstream_timeout": human(self.upstream_timeout),
            "stream_idle_timeout": human(self.stream_idle_timeout.unwrap_or_default()),
            "drain_timeout": human(self.drain_timeout),
            "final_scrape_grace": human(self.final_scrape_grace),
            "health_path": self.health_path,
            "health_interval": human(self.health_interval),
            "engine_metrics": self.engine_metrics.as_str(),
            "engine_metrics_path": self.engine_metrics_path,
            "engine_metrics_interval": human(self.engine_metrics_interval),
            "engine_metrics_max_samples": self.engine_metrics_max_samples,
            "tokenizer": self.tokenizer.as_ref().map(|p| p.display().to_string()),
            "service": self.slos.service,
            "period": human(self.slos.period),
            "min_events": self.slos.min_events,
            "gpu": {
                "enabled": self.gpu.enabled,
                "interval": human(self.gpu.interval),
                "library_path": self.gpu.library_path,
                "processes": self.gpu.processes,
                "simulated": self.gpu.simulated,
            },
            "capacity": {"window": human(self.capacity_window)},
        });
        let mut mapping: serde_yaml::Mapping = serde_json::from_value(value).expect("plain JSON maps to YAML");
        if self.buckets != BucketOverrides::default() {
            let buckets = serde_json::to_value(&self.buckets).expect("bucket overrides serialize");
            mapping.insert(
                "buckets".into(),
                serde_json::from_value(buckets).expect("plain JSON maps to YAML"),
            );
        }
        if self.otel != OtelConfig::default() {
            let mut otel = self.otel.clone();
            if otel.exporter_otlp_headers.is_some() {
                otel.exporter_otlp_headers = Some("<redacted>".into());
            }
            let otel = serde_json::to_value(&otel).expect("otel keys serialize");
            mapping.insert(
                "otel".into(),
                serde_json::from_value(otel).expect("plain JSON maps to YAML"),
            );
        }
        mapping.insert("slos".into(), slos.into());
        let mut goodput = serde_yaml::Mapping::new();
        goodput.insert("require".into(), require.into());
        mapping.insert("goodput".into(), goodput.into());
        serde_yaml::to_string(&mapping).expect("a mapping serializes")
    }
}

/// The file's schema and its text (to place later errors at their line).
fn read_file(path: &Path) -> Result<(FileConfig, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = parse_yaml(&text).map_err(|message| ConfigError::Parse {
        path: path.to_path_buf(),
        message,
    })?;
    Ok((file, text))
}

/// The keys forwarding needs, read from a file that is otherwise unusable: whatever of them
/// is a string at the top level of a YAML mapping.
#[derive(Debug, Default)]
struct ForwardingKeys {
    upstream: Option<String>,
    listen: Option<String>,
    metrics_listen: Option<String>,
}

fn forwarding_keys(path: &Path) -> ForwardingKeys {
    let Some(value) = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_yaml::from_str::<serde_yaml::Value>(&text).ok())
    else {
        return ForwardingKeys::default();
    };
    let key = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_string);
    ForwardingKeys {
        upstream: key("upstream"),
        listen: key("listen"),
        metrics_listen: key("metrics_listen"),
    }
}

/// Takes the SLO keys out of the file and validates them; the rest of `f` is left in place.
fn slo_set(f: &mut FileConfig) -> Result<SloSet, ConfigError> {
    let file = SloFile {
        slos: std::mem::take(&mut f.slos),
        goodput: f.goodput.take(),
    };
    SloSet::validate(f.service.take(), f.period, f.min_events, file)
        .map_err(|(key, message)| ConfigError::invalid(&key, message))
}

fn parse_yaml(text: &str) -> Result<FileConfig, String> {
    if text.trim().is_empty() {
        return Ok(FileConfig::default());
    }
    serde_yaml::from_str(text).map_err(|e| {
        let message = with_hint(&e.to_string());
        match e.location().and_then(|at| indentation_hint(text, &message, at.line())) {
            Some(hint) => format!("{message} ({hint})"),
            None => message,
        }
    })
}

/// Keys of an SLO entry, to recognise one that slipped out of its entry.
const SLO_KEYS: [&str; 8] = [
    "name",
    "objective",
    "ttft",
    "answer_ttft",
    "tpot",
    "e2e",
    "availability",
    "runbook_url",
];

/// For an error that a mis-indented line causes, the line that is most likely wrong (YAML
/// often reports the line before it, or the block it broke). `line` is 1-based.
fn indentation_hint(text: &str, message: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let key = |l: &str| {
        l.trim_start()
            .trim_start_matches("- ")
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let at = lines.get(line.checked_sub(1)?)?;
    // A deeper line that looks like `key: value` right after a scalar continues that scalar.
    if message.contains("invalid type: string") {
        let next = lines.get(line)?;
        if indent(next) > indent(at) && next.contains(": ") {
            return Some(format!(
                "line {}: `{}:` is indented deeper than `{}:` on line {line}, so YAML read it as the rest of \
                 that value; give it the same indentation",
                line + 1,
                key(next),
                key(at)
            ));
        }
    }
    if message.contains("did not find expected") || message.contains("mapping values are not allowed") {
        return Some(format!(
            "line {line}: `{}:` is indented {} spaces, which lines up with no key of the block above; check its \
             indentation",
            key(at),
            indent(at)
        ));
    }
    let unknown = message.split_once("unknown field `")?.1.split('`').next()?;
    if indent(at) == 0 && SLO_KEYS.contains(&unknown) {
        return Some(format!(
            "line {line}: `{unknown}` is a key of an SLO; indent it to line up with the other keys of its entry under \
             `slos:`"
        ));
    }
    None
}

/// A YAML error with what the user most likely meant: the closest known key for an unknown
/// one, a unit for a bare number where a duration goes.
fn with_hint(message: &str) -> String {
    if let Some((before, rest)) = message.split_once("unknown field `") {
        let Some((unknown, after)) = rest.split_once('`') else {
            return message.to_string();
        };
        let known = after.split('`').skip(1).step_by(2);
        let closest = known
            .map(|key| (strsim::damerau_levenshtein(unknown, key), key))
            .min()
            .filter(|(distance, key)| *distance <= 2.max(key.len() / 4));
        if let Some((_, key)) = closest {
            return format!("{before}unknown field `{unknown}` (did you mean `{key}`?){after}");
        }
        return message.to_string();
    }
    if let Some((before, rest)) = message.split_once(", expected a duration") {
        let value = before.rsplit(' ').next().unwrap_or("").trim_matches('"');
        if value.parse::<f64>().is_ok() {
            return format!("{before}, expected a duration with a unit, like `{value}ms` or `{value}s`{rest}");
        }
    }
    message.to_string()
}

/// A listen address: `HOST:PORT`, or `:PORT` for every interface (as Go programs write it).
fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    let every_interface;
    let full = match value.strip_prefix(':') {
        Some(port) => {
            every_interface = format!("0.0.0.0:{port}");
            every_interface.as_str()
        }
        None => value,
    };
    full.parse()
        .map_err(|_| ConfigError::invalid(key, format!("`{value}` is not an address like 0.0.0.0:8080 or :8080")))
}

fn parse_upstream(value: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = value
        .parse()
        .map_err(|e| ConfigError::invalid("upstream", format!("`{value}` is not a URI: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(ConfigError::invalid(
                "upstream",
                "https upstreams are not supported: llmslo runs beside the engine and speaks plain HTTP to it",
            ))
        }
        _ => {
            return Err(ConfigError::invalid(
                "upstream",
                format!("`{value}` must start with http://"),
            ))
        }
    }
    if uri.authority().is_none() {
        return Err(ConfigError::invalid("upstream", format!("`{value}` has no host")));
    }
    if uri.query().is_some() {
        return Err(ConfigError::invalid("upstream", "must not have a query string"));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mis_indented_keys_are_reported_on_their_own_line() {
        let error = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
        let head = "upstream: http://127.0.0.1:8000\nslos:\n  - name: tpot\n    objective: 99\n";
        // Deeper: YAML reads it as the rest of `objective`'s value and blames line 4.
        let deeper = error(&format!("{head}      tpot: 50ms\n"));
        assert!(
            deeper.contains("line 5: `tpot:` is indented deeper than `objective:` on line 4"),
            "{deeper}"
        );
        // Shallower, inside the list: the block breaks at line 5.
        let shallower = error(&format!("{head}   tpot: 50ms\n"));
        assert!(
            shallower.contains("line 5: `tpot:` is indented 3 spaces"),
            "{shallower}"
        );
        // At the top level: an SLO key where only top-level keys go.
        let out = error(&format!("{head}tpot: 50ms\n"));
        assert!(out.contains("line 5: `tpot` is a key of an SLO"), "{out}");
        // A top-level key indented into the list.
        let goodput = error(&format!("{head}    tpot: 50ms\n  goodput:\n    require: [tpot]\n"));
        assert!(goodput.contains("line 6: `goodput:` is indented 2 spaces"), "{goodput}");
    }

    #[test]
    fn a_file_that_cannot_be_used_runs_on_flags_with_what_forwarding_needs_from_it() {
        let dir = std::env::temp_dir();
        let overrides = |upstream: Option<&str>| Overrides {
            upstream: upstream.map(str::to_string),
            ..Overrides::default()
        };
        // Missing (an optional ConfigMap that is not there): the flags' upstream.
        let missing = dir.join("llmslo-fail-open-missing.yaml");
        let config = Config::load_fail_open(overrides(Some("http://127.0.0.1:9")), Some(&missing)).unwrap();
        assert_eq!(config.upstream.to_string(), "http://127.0.0.1:9/");
        assert!(config
            .file_error
            .as_deref()
            .unwrap()
            .contains("llmslo-fail-open-missing.yaml"));
        // Invalid SLOs: the file's own upstream and listen are still used, the SLOs are not.
        let invalid = dir.join(format!("llmslo-fail-open-{}.yaml", std::process::id()));
        std::fs::write(
            &invalid,
            "upstream: http://127.0.0.1:7\nlisten: 127.0.0.1:0\nslos:\n  - name: a\n    objective: 150\n    tpot: 50ms\n",
        )
        .unwrap();
        let config = Config::load_fail_open(overrides(None), Some(&invalid)).unwrap();
        assert_eq!(config.upstream.to_string(), "http://127.0.0.1:7/");
        assert_eq!(config.listen.to_string(), "127.0.0.1:0");
        assert!(config.slos.slos.is_empty());
        assert!(config.file_error.is_some());
        assert_eq!(
            config.file.as_deref(),
            Some(invalid.as_path()),
            "still watched for a fix"
        );
        // Nothing to forward to: an error.
        std::fs::write(&invalid, "slos: [\n").unwrap();
        assert!(Config::load_fail_open(overrides(None), Some(&invalid)).is_err());
        std::fs::remove_file(invalid).unwrap();
        // A valid file has no error.
        assert!(Config::load_fail_open(overrides(Some("http://127.0.0.1:9")), None)
            .unwrap()
            .file_error
            .is_none());
    }

    #[test]
    fn yaml_errors_say_what_was_most_likely_meant() {
        let error = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
        let typo = error("upstream: http://x:1\nmax_modles: 3\n");
        assert!(
            typo.contains("unknown field `max_modles` (did you mean `max_models`?)"),
            "{typo}"
        );
        assert!(typo.contains("line 2"), "{typo}");
        let nested = error("upstream: http://x:1\nslos:\n  - {name: a, objectiv: 99, tpot: 50ms}\n");
        assert!(nested.contains("(did you mean `objective`?)"), "{nested}");
        // Nothing close: no guess.
        let far = error("upstream: http://x:1\nzzz: 3\n");
        assert!(!far.contains("did you mean"), "{far}");
        let bare = error("upstream: http://x:1\nslos:\n  - {name: a, objective: 99, tpot: 50}\n");
        assert!(
            bare.contains("expected a duration with a unit, like `50ms` or `50s`"),
            "{bare}"
        );
        let bare = error("upstream: http://x:1\nupstream_timeout: 50\n");
        assert!(
            bare.contains("like `50ms` or `50s`") && bare.contains("line 2"),
            "{bare}"
        );
    }

    #[test]
    fn engine_metrics_settings_are_checked() {
        let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
        assert_eq!(
            (
                c.engine_metrics,
                c.engine_metrics_path.as_str(),
                c.engine_metrics_interval
            ),
            (EngineMetricsMode::Map, "/metrics", Duration::from_secs(5))
        );
        let c = Config::from_yaml("upstream: http://x:1\nengine_metrics: merge\nengine_metrics_path: /m\n").unwrap();
        assert_eq!(c.engine_metrics, EngineMetricsMode::Merge);
        let bad = Config::from_yaml("upstream: http://x:1\nengine_metrics: sometimes\n")
            .unwrap_err()
            .to_string();
        assert!(
            bad.contains("sometimes") && bad.contains("`merge`") && bad.contains("line 2"),
            "{bad}"
        );
        assert_eq!(
            key_of(Config::from_yaml("upstream: http://x:1\nengine_metrics_interval: 0s\n")),
            "engine_metrics_interval"
        );
        assert_eq!(
            key_of(Config::from_yaml(
                "upstream: http://x:1\nengine_metrics_path: metrics\n"
            )),
            "engine_metrics_path"
        );
    }

    fn key_of(result: Result<Config, ConfigError>) -> String {
        let error = result.unwrap_err();
        error.key().map_or_else(|| error.to_string(), str::to_string)
    }

    #[test]
    fn defaults_apply_to_a_minimal_file() {
        let c = Config::from_yaml("upstream: http://127.0.0.1:8000\n").unwrap();
        assert_eq!(c.listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(c.metrics_listen, "0.0.0.0:9464".parse().unwrap());
        assert_eq!(c.max_peek_bytes, 4 << 20);
        assert_eq!(c.max_body_bytes, 64 << 20);
        assert_eq!(c.max_buffered_request_bytes, 16 << 20);
        assert_eq!(c.request_body_timeout, Duration::from_secs(30));
        assert_eq!(c.send_timeout, Duration::from_secs(60));
        assert_eq!(c.max_connections, 2048);
        assert_eq!(c.max_streams_per_connection, 100);
        assert_eq!(c.max_in_flight_requests, 1024);
        assert_eq!(c.request_body_total_timeout, Duration::from_secs(300));
        assert_eq!(c.stream_idle_timeout, Some(Duration::from_secs(300)));
        assert_eq!(c.max_event_bytes, 1 << 20);
        assert_eq!(c.upstream_timeout, Duration::from_secs(600));
        assert_eq!(c.drain_timeout, Duration::from_secs(30));
        assert_eq!(c.max_models, 16);
        assert_eq!(c.health_path, "/health");
        assert_eq!(c.engine, EngineSetting::Auto);
        assert!(c.inject_usage);
    }

    #[test]
    fn every_key_parses_from_yaml() {
        let c = Config::from_yaml(
            "upstream: http://engine:8000/base\nlisten: 127.0.0.1:1\nmetrics_listen: 127.0.0.1:2\nlog: debug\n\
             log_format: json\nengine: vllm\ninject_usage: false\nmodels: [a, b]\nmax_models: 3\nmax_peek_bytes: 1024\n\
             max_event_bytes: 2048\nupstream_timeout: 2m\ndrain_timeout: 5s\nhealth_path: /ping\n\
             health_interval: 1s\nbuckets:\n  ttft: [0.1, 0.5]\n",
        )
        .unwrap();
        assert_eq!(c.upstream.path(), "/base");
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.engine, EngineSetting::Vllm);
        assert_eq!(c.models, ["a", "b"]);
        assert_eq!(c.upstream_timeout, Duration::from_secs(120));
        assert_eq!(c.buckets.ttft, Some(vec![0.1, 0.5]));
        let limits = Config::from_yaml(
            "upstream: http://x:1\nmax_body_bytes: 100\nmax_buffered_request_bytes: 8388608\n\
             request_body_timeout: 5s\nmax_connections: 7\nstream_idle_timeout: 0s\n",
        )
        .unwrap();
        assert_eq!(limits.max_body_bytes, 100);
        assert_eq!(limits.max_buffered_request_bytes, 8 << 20);
        assert_eq!(limits.request_body_timeout, Duration::from_secs(5));
        assert_eq!(limits.max_connections, 7);
        assert_eq!(limits.stream_idle_timeout, None, "0s turns it off");
        let again = Config::from_yaml(&limits.to_yaml()).unwrap();
        assert_eq!(again.stream_idle_timeout, None);
        assert_eq!(again.max_connections, 7);
    }

    #[test]
    fn flags_and_env_win_over_the_file() {
        let file = FileConfig {
            upstream: Some("http://file:1".into()),
            listen: Some("127.0.0.1:1".into()),
            ..FileConfig::default()
        };
        let flags = Overrides {
            upstream: Some("http://flag:2".into()),
            ..Overrides::default()
        };
        let c = Config::merge(flags, file).unwrap();
        assert_eq!(c.upstream.host(), Some("flag"));
        assert_eq!(c.listen, "127.0.0.1:1".parse().unwrap());
    }

    #[test]
    fn a_bad_value_names_the_flag_or_variable_it_came_from_and_a_bare_port_listens_everywhere() {
        let up = "upstream: http://127.0.0.1:8000\n";
        let file = || parse_yaml(&format!("{up}listen: 127.0.0.1:1\n")).unwrap();
        let flags = Overrides {
            metrics_listen: Some(":18404".into()),
            listen: Some(":8443".into()),
            ..Overrides::default()
        };
        let c = Config::merge(flags, file()).unwrap();
        assert_eq!(c.listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(c.metrics_listen, "0.0.0.0:18404".parse().unwrap());
        let bad = |from_env: Vec<&'static str>| {
            let given = Overrides {
                listen: Some("nowhere".into()),
                from_env,
                ..Overrides::default()
            };
            Config::merge(given, file()).unwrap_err().to_string()
        };
        assert_eq!(
            bad(vec![]),
            "flag --listen: `nowhere` is not an address like 0.0.0.0:8080 or :8080"
        );
        assert_eq!(
            bad(vec!["listen"]),
            "environment variable LLMSLO_LISTEN: `nowhere` is not an address like 0.0.0.0:8080 or :8080"
        );
        // The file's own bad value still names its key.
        let error = Config::from_yaml(&format!("{up}listen: nowhere\n"))
            .unwrap_err()
            .to_string();
        assert!(error.contains(":2: config key `listen`: `nowhere`"), "{error}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let up = "upstream: http://127.0.0.1:8000\n";
        assert_eq!(key_of(Config::from_yaml("listen: 1.2.3.4:5\n")), "upstream");
        assert_eq!(key_of(Config::from_yaml("upstream: https://x:1\n")), "upstream");
        assert_eq!(key_of(Config::from_yaml("upstream: ftp://x\n")), "upstream");
        assert_eq!(key_of(Config::from_yaml("upstream: /relative\n")), "upstream");
        assert_eq!(key_of(Config::from_yaml(&format!("{up}listen: nowhere\n"))), "listen");
        assert_eq!(key_of(Config::from_yaml(&format!("{up}max_models: 0\n"))), "max_models");
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}max_event_bytes: 10\n"))),
            "max_event_bytes"
        );
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}upstream_timeout: 0s\n"))),
            "upstream_timeout"
        );
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}health_path: health\n"))),
            "health_path"
        );
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}max_body_bytes: 0\n"))),
            "max_body_bytes"
        );
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}max_buffered_request_bytes: 1024\n"))),
            "max_buffered_request_bytes"
        );
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}max_connections: 0\n"))),
            "max_connections"
        );
        for key in ["max_streams_per_connection", "max_in_flight_requests"] {
            assert_eq!(key_of(Config::from_yaml(&format!("{up}{key}: 0\n"))), key);
        }
        assert_eq!(
            key_of(Config::from_yaml(&format!(
                "{up}request_body_timeout: 30s\nrequest_body_total_timeout: 10s\n"
            ))),
            "request_body_total_timeout"
        );
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}request_body_timeout: 0s\n"))),
            "request_body_timeout"
        );
        assert_eq!(key_of(Config::from_yaml(&format!("{up}log: \"llmslo=loud\"\n"))), "log");
        assert_eq!(
            key_of(Config::from_yaml(&format!("{up}buckets: {{tpot: [0.2, 0.1]}}\n"))),
            "buckets.tpot"
        );
    }

    #[test]
    fn slos_are_part_of_the_file_and_their_errors_name_the_key() {
        let c = Config::from_yaml(
            "upstream: http://x:1\nservice: chat\nperiod: 7d\nmin_events: 5\nslos:\n  - {name: tpot, objective: 99, tpot: 50ms}\ngoodput: {require: [tpot]}\n",
        )
        .unwrap();
        assert_eq!(c.slos.service, "chat");
        assert_eq!(c.slos.period, Duration::from_secs(7 * 86_400));
        assert_eq!(c.slos.goodput_require, [0]);
        assert_eq!(
            key_of(Config::from_yaml(
                "upstream: http://x:1\nslos:\n  - {name: t, objective: 200, tpot: 1s}\n"
            )),
            "slos[0].objective"
        );
        let typo = Config::from_yaml("upstream: http://x:1\nslos:\n  - {name: t, objectve: 99, tpot: 1s}\n");
        assert!(typo.unwrap_err().to_string().contains("objectve"));
    }

    #[test]
    fn otel_keys_are_read_checked_and_printed_without_credentials() {
        let c = Config::from_yaml(
            "upstream: http://x:1\notel: {traces_exporter: otlp, exporter_otlp_headers: 'authorization=Bearer s3cret'}\n",
        )
        .unwrap();
        assert_eq!(c.otel.traces_exporter.as_deref(), Some("otlp"));
        let printed = c.to_yaml();
        assert!(printed.contains("traces_exporter: otlp"), "{printed}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert_eq!(
            key_of(Config::from_yaml(
                "upstream: http://x:1\notel: {traces_exporter: zipkin}\n"
            )),
            "otel.traces_exporter"
        );
        assert!(Config::from_yaml("upstream: http://x:1\notel: {endpoint: x}\n").is_err());
    }

    #[test]
    fn gpu_settings() {
        let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
        assert!(c.gpu.enabled && !c.gpu.processes);
        assert_eq!(c.gpu.interval, Duration::from_secs(1));
        assert_eq!(c.gpu.library_path, "libnvidia-ml.so.1");
        let off =
            Config::from_yaml("upstream: http://x:1\ngpu: {enabled: false, interval: 5s, processes: true}\n").unwrap();
        assert!(!off.gpu.enabled && off.gpu.processes);
        assert_eq!(
            key_of(Config::from_yaml("upstream: http://x:1\ngpu: {interval: 1ms}\n")),
            "gpu.interval"
        );
        let typo = Config::from_yaml("upstream: http://x:1\ngpu: {enable: false}\n")
            .unwrap_err()
            .to_string();
        assert!(typo.contains("enable"), "{typo}");
    }

    #[test]
    fn capacity_window() {
        let c = Config::from_yaml("upstream: http://x:1\n").unwrap();
        assert_eq!(c.capacity_window, Duration::from_secs(30 * 60));
        let c = Config::from_yaml("upstream: http://x:1\ncapacity: {window: 2h}\n").unwrap();
        assert_eq!(c.capacity_window, Duration::from_secs(2 * 3600));
        for bad in [
            "capacity: {window: 10s}",
            "capacity: {window: 2d}",
            "capacity: {window: soon}",
        ] {
            let error = Config::from_yaml(&format!("upstream: http://x:1\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(error.contains("capacity") || error.contains("window"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_effective_config_round_trips() {
        let c = Config::from_yaml(
            "upstream: http://x:1\nengine: tgi\nslos:\n  - {name: a, objective: 99.5, ttft: 500ms}\n  \
             - {name: b, objective: 99.9, availability: true}\ngoodput: {require: [a]}\nbuckets: {ttft: [0.1, 1.0]}\n\
             capacity: {window: 45m}\n",
        )
        .unwrap();
        let again = Config::from_yaml(&c.to_yaml()).unwrap();
        assert_eq!(again.slos, c.slos);
        assert_eq!(again.engine, c.engine);
        assert_eq!(again.buckets, c.buckets);
        assert_eq!(again.upstream_timeout, c.upstream_timeout);
        assert_eq!(again.gpu, c.gpu);
        assert_eq!(again.capacity_window, c.capacity_window);
    }

    #[test]
    fn schema_errors_name_the_key_and_line() {
        let unknown = Config::from_yaml("upstream: http://x:1\nmax_modles: 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("max_modles") && unknown.contains("line 2"),
            "{unknown}"
        );
        let wrong_type = Config::from_yaml("upstream: http://x:1\nmax_models: many\n")
            .unwrap_err()
            .to_string();
        assert!(
            wrong_type.contains("max_models") && wrong_type.contains("line 2"),
            "{wrong_type}"
        );
        let duration = Config::from_yaml("upstream: http://x:1\ndrain_timeout: soon\n")
            .unwrap_err()
            .to_string();
        assert!(duration.contains("drain_timeout"), "{duration}");
        let engine = Config::from_yaml("upstream: http://x:1\nengine: triton\n")
            .unwrap_err()
            .to_string();
        assert!(engine.contains("engine") && engine.contains("triton"), "{engine}");
    }
}
