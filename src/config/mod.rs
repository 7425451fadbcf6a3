//! Typed, validated configuration from flags, environment and a YAML file
//! (precedence: flag > environment > file > default). Each module owns its settings and
//! their defaults; this module reads the file, the flags and the environment and composes
//! them, above every module it configures:
//! - [`file`]: the file's schema, its reading, and the merge of flags over file over defaults;
//! - [`validate`]: the checks of values that parse but cannot be used;
//! - [`error`]: the errors, with the key, the line, and what was most likely meant;
//! - [`print`]: the effective configuration, as `llmslo check-config` prints it;
//! - [`memory`]: the worst case of memory the limits allow.

pub mod defaults;
mod error;
mod file;
mod locate;
pub mod memory;
mod print;
#[cfg(test)]
mod tests;
mod tls;
mod validate;

use crate::cost::CostSettings;
use crate::engine::EngineMetricsMode;
use crate::gpu::GpuSettings;
use crate::metrics::buckets::BucketOverrides;
use crate::observe::tenants::TenantSettings;
use crate::otel::settings::{OtelConfig, OtelSettings, SettingError};
use crate::record::Engine;
use crate::slo::spec::SloSet;
pub use error::ConfigError;
use file::{forwarding_keys, parse_yaml, read_file, slo_set, FileConfig};
use http::Uri;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// `--role` / `LLMSLO_ROLE`.
    pub role: Option<crate::record::Role>,
    /// `--prefill-relay` / `LLMSLO_PREFILL_RELAY`.
    pub prefill_relay: Option<String>,
    /// `--prefill-pool` / `LLMSLO_PREFILL_POOL`: members separated by commas.
    pub prefill_pool: Option<String>,
    /// `--tls-cert-file` / `LLMSLO_TLS_CERT_FILE`.
    pub tls_cert_file: Option<PathBuf>,
    /// `--tls-key-file` / `LLMSLO_TLS_KEY_FILE`.
    pub tls_key_file: Option<PathBuf>,
    /// `--tls-self-signed` / `LLMSLO_TLS_SELF_SIGNED`.
    pub tls_self_signed: Option<bool>,
    /// `--upstream-ca-file` / `LLMSLO_UPSTREAM_CA_FILE`.
    pub upstream_ca_file: Option<PathBuf>,
    /// `--upstream-insecure-skip-verify` / `LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY`.
    pub upstream_insecure_skip_verify: Option<bool>,
    /// `--prefill-tls` / `LLMSLO_PREFILL_TLS`.
    pub prefill_tls: Option<bool>,
    /// `--prefill-ca-file` / `LLMSLO_PREFILL_CA_FILE`.
    pub prefill_ca_file: Option<PathBuf>,
    /// `--prefill-insecure-skip-verify` / `LLMSLO_PREFILL_INSECURE_SKIP_VERIFY`.
    pub prefill_insecure_skip_verify: Option<bool>,
    /// The keys above whose value came from the environment rather than a flag.
    pub from_env: Vec<&'static str>,
}

impl Overrides {
    /// Where the value of `key` came from: its flag, its environment variable, or (when
    /// neither gave it) `None`, the file or the default.
    pub(super) fn origin(&self, key: &str) -> Option<String> {
        let given = match key {
            "upstream" => self.upstream.is_some(),
            "listen" => self.listen.is_some(),
            "metrics_listen" => self.metrics_listen.is_some(),
            "log" => self.log.is_some(),
            "log_format" => self.log_format.is_some(),
            "engine" => self.engine.is_some(),
            "role" => self.role.is_some(),
            "prefill_relay" => self.prefill_relay.is_some(),
            "prefill_pool" => self.prefill_pool.is_some(),
            "tls_cert_file" => self.tls_cert_file.is_some(),
            "tls_key_file" => self.tls_key_file.is_some(),
            "tls_self_signed" => self.tls_self_signed.is_some(),
            "upstream_ca_file" => self.upstream_ca_file.is_some(),
            "upstream_insecure_skip_verify" => self.upstream_insecure_skip_verify.is_some(),
            "prefill_tls" => self.prefill_tls.is_some(),
            "prefill_ca_file" => self.prefill_ca_file.is_some(),
            "prefill_insecure_skip_verify" => self.prefill_insecure_skip_verify.is_some(),
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

/// The effective, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The engine's base URI (`http://host:port`, or `https://`).
    pub upstream: Uri,
    /// `upstream_tls`: how an https upstream is verified.
    pub upstream_tls: crate::upstream::tls::UpstreamTls,
    /// `prefill_tls`: the prefill relay serves TLS and sends its legs over https, verified so.
    pub prefill_tls: Option<crate::upstream::tls::UpstreamTls>,
    /// `tls`: where the proxy port's certificate comes from, when it serves TLS.
    pub tls: Option<crate::serve::tls::TlsSource>,
    /// `metrics_tls`: the metrics port serves TLS with the same certificate.
    pub metrics_tls: bool,
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
    /// Of those, the most one client address may hold (429 beyond it).
    pub max_in_flight_per_client: usize,
    /// Largest stream event (or JSON response) interpreted.
    pub max_event_bytes: usize,
    /// How long the engine may take to send a response head (then 504).
    pub upstream_timeout: Duration,
    /// Longest silence of the engine within a response body (then `timeout`); `None` is off.
    pub stream_idle_timeout: Option<Duration>,
    /// How long an engine connection is kept open between requests.
    pub upstream_idle_timeout: Duration,
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
    /// `tenants:`: whom requests serve (no sources: no `tenant` label).
    pub tenants: TenantSettings,
    /// `per_request_slos`: how a request's own latency targets judge its goodput.
    pub per_request_slos: crate::record::PerRequestSlos,
    /// `cost:`: the prices, and the cost SLOs.
    pub cost: CostSettings,
    /// `workload.recent_requests`: generation requests kept for `/workload` (0: off).
    pub recent_requests: usize,
    /// `role`: the pod's role in disaggregated serving.
    pub role: crate::record::Role,
    /// `prefill_relay`: where a decode pod's sidecar relays (and times) the prefill legs of the
    /// requests it forwards; `None` is off.
    pub prefill_relay: Option<std::net::SocketAddr>,
    /// `prefill_pool`: the only pods the relay sends legs to (their addresses, ranges, or a
    /// headless Service's DNS name, each with the port).
    pub prefill_pool: Vec<crate::proxy::relay::pool::PoolMember>,
    /// `decode_leg_sources`: beside loopback, the clients whose requests may be decode legs on
    /// a decode pod (a router that sends legs itself).
    pub decode_leg_sources: Vec<ipnet::IpNet>,
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

    /// `path` merged under `overrides`, its errors placed at their lines. `checking` is
    /// check-config's reading: a missing upstream is stood in for, and an API-key table that
    /// cannot be read is an error (the sidecar runs on without it). Also says whether an
    /// upstream was given.
    fn from_file(mut overrides: Overrides, path: &Path, checking: bool) -> Result<(Self, bool), ConfigError> {
        let (file_config, text) = read_file(path)?;
        let upstream_given = overrides.upstream.is_some() || file_config.upstream.is_some();
        if checking && !upstream_given {
            overrides.upstream = Some(CHECK_PLACEHOLDER_UPSTREAM.to_string());
        }
        let mut config = Self::merge(overrides, file_config).map_err(|e| e.located(path, &text))?;
        if checking {
            config.key_tables_read().map_err(|e| e.located(path, &text))?;
        }
        config.file = Some(path.to_path_buf());
        Ok((config, upstream_given))
    }

    /// An error for the first API-key table that could not be read.
    fn key_tables_read(&self) -> Result<(), ConfigError> {
        match crate::observe::tenants::Tenants::key_table_errors(&self.tenants).next() {
            Some((i, error)) => Err(ConfigError::invalid(&format!("tenants.from[{i}].api_keys"), error)),
            None => Ok(()),
        }
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

    /// Builds the configuration from YAML text alone (no flags or environment), read as
    /// check-config reads it (an API-key table that cannot be read is an error).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let inline = Path::new("<inline>");
        let file = parse_yaml(text).map_err(|message| ConfigError::Parse {
            path: inline.to_path_buf(),
            message,
        })?;
        let config = Self::merge(Overrides::default(), file).map_err(|e| e.located(inline, text))?;
        config.key_tables_read().map_err(|e| e.located(inline, text))?;
        Ok(config)
    }

    /// OTLP export as the `otel:` keys and the `OTEL_*` variables set it.
    pub fn otel_settings(&self) -> Result<OtelSettings, SettingError> {
        OtelSettings::resolve(&self.otel, |name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }
}
