//! The config file: its schema (every key optional), its reading, and the merge of flags and
//! environment over the file over each module's defaults.

use super::error::{indentation_hint, with_hint};
use super::validate::{parse_addr, parse_upstream};
use super::{defaults, Config, ConfigError, EngineSetting, LogFormat, Overrides};
use crate::cost::{CostKind, CostSettings, CostSlo, DEFAULT_INPUT_TOKEN_WEIGHT};
use crate::engine::EngineMetricsMode;
use crate::gpu::GpuSettings;
use crate::metrics::buckets::BucketOverrides;
use crate::observe::tenants::{
    read_key_table, BodyField, SourceSetting, TenantSettings, DEFAULT_FORGET_AFTER, DEFAULT_MAX_TENANTS,
};
use crate::otel::settings::OtelConfig;
use crate::proxy::relay::pool::PoolMember;
use crate::record::{LabelText, PerRequestSlos};
use crate::slo::spec::{GoodputEntry, SloEntry, SloFile, SloSet};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The YAML file's schema; every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) upstream: Option<String>,
    pub(super) listen: Option<String>,
    pub(super) metrics_listen: Option<String>,
    pub(super) log: Option<String>,
    pub(super) log_format: Option<LogFormat>,
    pub(super) engine: Option<EngineSetting>,
    pub(super) inject_usage: Option<bool>,
    pub(super) models: Option<Vec<String>>,
    pub(super) max_models: Option<usize>,
    pub(super) max_peek_bytes: Option<usize>,
    pub(super) max_body_bytes: Option<u64>,
    pub(super) max_buffered_request_bytes: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub(super) request_body_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) request_body_total_timeout: Option<Duration>,
    pub(super) request_body_min_rate: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub(super) send_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) connection_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) http2_keep_alive_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) http2_keep_alive_timeout: Option<Duration>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_streams_per_connection: Option<u32>,
    pub(super) max_in_flight_requests: Option<usize>,
    pub(super) max_in_flight_per_client: Option<usize>,
    pub(super) max_event_bytes: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub(super) upstream_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) stream_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) upstream_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) drain_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) final_scrape_grace: Option<Duration>,
    pub(super) health_path: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub(super) health_interval: Option<Duration>,
    pub(super) engine_metrics: Option<EngineMetricsMode>,
    pub(super) engine_metrics_path: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub(super) engine_metrics_interval: Option<Duration>,
    pub(super) engine_metrics_max_samples: Option<usize>,
    pub(super) tokenizer: Option<PathBuf>,
    pub(super) buckets: Option<BucketOverrides>,
    pub(super) service: Option<String>,
    #[serde(default, with = "humantime_serde")]
    pub(super) period: Option<Duration>,
    pub(super) min_events: Option<u64>,
    pub(super) fleet_labels: Option<Vec<String>>,
    #[serde(default)]
    pub(super) slos: Vec<SloEntry>,
    pub(super) goodput: Option<GoodputEntry>,
    pub(super) gpu: Option<GpuFile>,
    pub(super) capacity: Option<CapacityFile>,
    pub(super) otel: Option<OtelConfig>,
    pub(super) tenants: Option<TenantsFile>,
    pub(super) cost: Option<CostFile>,
    pub(super) per_request_slos: Option<PerRequestSlosEntry>,
    pub(super) workload: Option<WorkloadFile>,
    pub(super) role: Option<crate::record::Role>,
    pub(super) prefill_relay: Option<String>,
    pub(super) prefill_pool: Option<Vec<String>>,
    pub(super) decode_leg_sources: Option<Vec<String>>,
    pub(super) tls: Option<super::tls::TlsFile>,
    pub(super) metrics_tls: Option<bool>,
    pub(super) upstream_tls: Option<super::tls::UpstreamTlsFile>,
    pub(super) prefill_tls: Option<super::tls::PrefillTlsFile>,
}

/// `per_request_slos:` as written: `off`, `separate` or `trusted`; `false` is `off`, and
/// `true` (the older spelling of "on") and `stricter` (the older default) are `separate`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PerRequestSlosEntry(pub(super) PerRequestSlos);

impl<'de> Deserialize<'de> for PerRequestSlosEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = PerRequestSlosEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("off, separate or trusted")
            }
            fn visit_bool<E: serde::de::Error>(self, on: bool) -> Result<Self::Value, E> {
                Ok(PerRequestSlosEntry(if on {
                    PerRequestSlos::Separate
                } else {
                    PerRequestSlos::Off
                }))
            }
            fn visit_str<E: serde::de::Error>(self, mode: &str) -> Result<Self::Value, E> {
                match mode {
                    "off" => Ok(PerRequestSlosEntry(PerRequestSlos::Off)),
                    "separate" | "stricter" => Ok(PerRequestSlosEntry(PerRequestSlos::Separate)),
                    "trusted" => Ok(PerRequestSlosEntry(PerRequestSlos::Trusted)),
                    _ => Err(E::unknown_variant(mode, &["off", "separate", "trusted"])),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `workload:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WorkloadFile {
    recent_requests: Option<usize>,
}

/// `capacity:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CapacityFile {
    #[serde(default, with = "humantime_serde")]
    window: Option<Duration>,
}

/// `tenants:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TenantsFile {
    #[serde(default)]
    from: Vec<TenantSourceFile>,
    names: Option<Vec<String>>,
    max_tenants: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    forget_after: Option<Duration>,
    #[serde(default)]
    gauges: bool,
}

/// One entry of `tenants.from`: exactly one of its keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantSourceFile {
    header: Option<String>,
    api_keys: Option<PathBuf>,
    body: Option<String>,
}

/// The shortest and longest `tenants.forget_after`.
const FORGET_AFTER_MIN: Duration = Duration::from_secs(1);
const FORGET_AFTER_MAX: Duration = Duration::from_secs(30 * 86_400);

/// Most tenant labels a sidecar may keep: each multiplies the tenant families' series.
const MAX_TENANTS_LIMIT: usize = 1000;

/// `tenants:` read and checked: header names, body fields, the API key tables (read now; a
/// key is never part of an error) and the caps.
fn tenant_settings(file: Option<TenantsFile>) -> Result<TenantSettings, ConfigError> {
    let Some(file) = file else {
        return Ok(TenantSettings::default());
    };
    let mut from = Vec::new();
    for (i, source) in file.from.into_iter().enumerate() {
        let key = |name: &str| format!("tenants.from[{i}].{name}");
        from.push(match (source.header, source.api_keys, source.body) {
            (Some(header), None, None) => SourceSetting::Header(
                http::HeaderName::from_bytes(header.as_bytes())
                    .map_err(|_| ConfigError::invalid(&key("header"), format!("`{header}` is not a header name")))?,
            ),
            // A table that cannot be read is check-config's error; the sidecar runs on without
            // it (the tenants alone fail open) and reads it again when it changes.
            (None, Some(path), None) => SourceSetting::ApiKeys {
                table: read_key_table(&path),
                path,
            },
            (None, None, Some(body)) => SourceSetting::Body(BodyField::parse(&body).ok_or_else(|| {
                ConfigError::invalid(
                    &key("body"),
                    format!("`{body}` is not one of safety_identifier, user, metadata.user_id"),
                )
            })?),
            _ => {
                return Err(ConfigError::invalid(
                    &format!("tenants.from[{i}]"),
                    "give exactly one of header, api_keys, body",
                ))
            }
        });
    }
    let max_tenants = file.max_tenants.unwrap_or(DEFAULT_MAX_TENANTS);
    let forget_after = file.forget_after.unwrap_or(DEFAULT_FORGET_AFTER);
    if !(FORGET_AFTER_MIN..=FORGET_AFTER_MAX).contains(&forget_after) {
        return Err(ConfigError::invalid(
            "tenants.forget_after",
            "must be between 1s and 30 days: how long a learned tenant may be idle before its slot is given back",
        ));
    }
    let settings = TenantSettings {
        from,
        names: file.names.unwrap_or_default(),
        max_tenants,
        forget_after,
        gauges: file.gauges,
    };
    let pinned = settings.pinned_count();
    if pinned + max_tenants > MAX_TENANTS_LIMIT {
        // The key that brought it over: the names, else the tables, else max_tenants.
        let first_table = settings
            .from
            .iter()
            .position(|s| matches!(s, SourceSetting::ApiKeys { .. }));
        let key = match first_table {
            _ if settings.names.len() > MAX_TENANTS_LIMIT => "tenants.names".to_string(),
            Some(i) if pinned > MAX_TENANTS_LIMIT => format!("tenants.from[{i}].api_keys"),
            _ if pinned > MAX_TENANTS_LIMIT => "tenants.names".to_string(),
            _ => "tenants.max_tenants".to_string(),
        };
        return Err(ConfigError::invalid(
            &key,
            format!(
                "{pinned} named tenants (names and API-key tables) and max_tenants {max_tenants} make {}; at most \
                 {MAX_TENANTS_LIMIT} in all: each tenant multiplies the tenant families' series",
                pinned + max_tenants
            ),
        ));
    }
    Ok(settings)
}

/// `cost:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CostFile {
    gpu_hour_price: Option<f64>,
    #[serde(default)]
    gpu_hour_prices: BTreeMap<String, f64>,
    gpus: Option<u32>,
    energy_price_per_kwh: Option<f64>,
    input_token_weight: Option<f64>,
    #[serde(default)]
    slos: Vec<CostSloFile>,
}

/// One cost SLO as written: its name and exactly one bound.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CostSloFile {
    name: String,
    cost_per_million_output_tokens: Option<f64>,
    cost_per_million_input_tokens: Option<f64>,
}

/// `cost:` read and checked: prices that are numbers of money, a weight, named SLOs with one
/// positive bound each, and a price for them to be judged by.
fn cost_settings(file: Option<&CostFile>) -> Result<CostSettings, ConfigError> {
    let Some(file) = file else {
        return Ok(CostSettings::default());
    };
    let price = |key: &str, value: f64| {
        if value.is_finite() && value >= 0.0 {
            Ok(value)
        } else {
            Err(ConfigError::invalid(key, "must be a price: a number, 0 or more"))
        }
    };
    if let Some(p) = file.gpu_hour_price {
        price("cost.gpu_hour_price", p)?;
    }
    for (model, p) in &file.gpu_hour_prices {
        price(&format!("cost.gpu_hour_prices.{model}"), *p)?;
    }
    if let Some(p) = file.energy_price_per_kwh {
        price("cost.energy_price_per_kwh", p)?;
    }
    let gpus = file.gpus.unwrap_or(1);
    if gpus == 0 {
        return Err(ConfigError::invalid("cost.gpus", "must be at least 1"));
    }
    let weight = file.input_token_weight.unwrap_or(DEFAULT_INPUT_TOKEN_WEIGHT);
    if !(weight.is_finite() && weight > 0.0 && weight <= 10.0) {
        return Err(ConfigError::invalid(
            "cost.input_token_weight",
            "must be above 0 and at most 10 (an input token's GPU time relative to an output token's)",
        ));
    }
    let mut slos: Vec<CostSlo> = Vec::new();
    for (i, slo) in file.slos.iter().enumerate() {
        let key = format!("cost.slos[{i}]");
        let (kind, target) = match (slo.cost_per_million_output_tokens, slo.cost_per_million_input_tokens) {
            (Some(t), None) => (CostKind::PerMillionOutputTokens, t),
            (None, Some(t)) => (CostKind::PerMillionInputTokens, t),
            _ => {
                return Err(ConfigError::invalid(
                    &key,
                    "give exactly one of cost_per_million_output_tokens, cost_per_million_input_tokens",
                ))
            }
        };
        if !(target.is_finite() && target > 0.0) {
            return Err(ConfigError::invalid(
                &format!("{key}.{}", kind.as_str()),
                "must be above 0",
            ));
        }
        if slo.name.is_empty() || slos.iter().any(|s| s.name == slo.name) {
            return Err(ConfigError::invalid(
                &format!("{key}.name"),
                "must be given, and unique",
            ));
        }
        slos.push(CostSlo {
            name: slo.name.clone(),
            kind,
            target,
        });
    }
    let settings = CostSettings {
        gpu_hour_price: file.gpu_hour_price,
        gpu_hour_prices: file.gpu_hour_prices.clone(),
        gpus,
        energy_price_per_kwh: file.energy_price_per_kwh,
        input_token_weight: weight,
        slos,
    };
    if !settings.enabled() && !settings.slos.is_empty() {
        return Err(ConfigError::invalid(
            "cost.gpu_hour_price",
            "a cost SLO needs a price: give gpu_hour_price or gpu_hour_prices",
        ));
    }
    Ok(settings)
}

/// `gpu:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GpuFile {
    enabled: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    interval: Option<Duration>,
    library_path: Option<String>,
    processes: Option<bool>,
    simulated: Option<bool>,
}

impl Config {
    pub(super) fn merge(o: Overrides, f: FileConfig) -> Result<Self, ConfigError> {
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
        let upstream = parse_upstream(&upstream)?;
        let config = Config {
            upstream_tls: super::tls::upstream_tls(&overrides, f.upstream_tls, &upstream)?,
            tls: super::tls::listener_tls(&overrides, f.tls)?,
            prefill_tls: super::tls::prefill_tls(&overrides, f.prefill_tls)?,
            metrics_tls: f.metrics_tls.unwrap_or(false),
            upstream,
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
            // Half of all, by default: no one client keeps the others out.
            max_in_flight_per_client: f
                .max_in_flight_per_client
                .unwrap_or_else(|| (f.max_in_flight_requests.unwrap_or(defaults::MAX_IN_FLIGHT_REQUESTS) / 2).max(1)),
            max_event_bytes: f.max_event_bytes.unwrap_or(defaults::MAX_EVENT_BYTES),
            upstream_timeout: f.upstream_timeout.unwrap_or(defaults::UPSTREAM_TIMEOUT),
            stream_idle_timeout: Some(f.stream_idle_timeout.unwrap_or(defaults::STREAM_IDLE_TIMEOUT))
                .filter(|d| !d.is_zero()),
            upstream_idle_timeout: f.upstream_idle_timeout.unwrap_or(defaults::UPSTREAM_IDLE_TIMEOUT),
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
                let (g, default) = (f.gpu.unwrap_or_default(), GpuSettings::default());
                GpuSettings {
                    enabled: g.enabled.unwrap_or(default.enabled),
                    interval: g.interval.unwrap_or(default.interval),
                    library_path: g.library_path.unwrap_or(default.library_path),
                    processes: g.processes.unwrap_or(default.processes),
                    simulated: g.simulated.unwrap_or(default.simulated),
                }
            },
            capacity_window: f
                .capacity
                .and_then(|c| c.window)
                .unwrap_or(crate::capacity::DEFAULT_WINDOW),
            otel: f.otel.unwrap_or_default(),
            tenants: tenant_settings(f.tenants)?,
            cost: cost_settings(f.cost.as_ref())?,
            per_request_slos: f.per_request_slos.map(|e| e.0).unwrap_or_default(),
            recent_requests: f.workload.and_then(|w| w.recent_requests).unwrap_or(0),
            role: o.role.or(f.role).unwrap_or_default(),
            prefill_relay: match o.prefill_relay.or(f.prefill_relay) {
                Some(address) => Some(parse_addr("prefill_relay", &address)?),
                None => None,
            },
            prefill_pool: match o.prefill_pool {
                Some(list) => list
                    .split(',')
                    .map(str::to_string)
                    .filter(|m| !m.trim().is_empty())
                    .collect(),
                None => f.prefill_pool.unwrap_or_default(),
            }
            .iter()
            .map(|member| PoolMember::parse(member).map_err(|e| ConfigError::invalid("prefill_pool", e)))
            .collect::<Result<_, _>>()?,
            decode_leg_sources: f
                .decode_leg_sources
                .unwrap_or_default()
                .iter()
                .map(|source| parse_source(source))
                .collect::<Result<_, _>>()?,
            file: None,
            file_error: None,
            overrides,
        };
        config.validate()?;
        Ok(config)
    }
}

/// The file's schema and its text (to place later errors at their line).
pub(super) fn read_file(path: &Path) -> Result<(FileConfig, String), ConfigError> {
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
pub(super) struct ForwardingKeys {
    pub(super) upstream: Option<String>,
    pub(super) listen: Option<String>,
    pub(super) metrics_listen: Option<String>,
}

pub(super) fn forwarding_keys(path: &Path) -> ForwardingKeys {
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
pub(super) fn slo_set(f: &mut FileConfig) -> Result<SloSet, ConfigError> {
    let file = SloFile {
        slos: std::mem::take(&mut f.slos),
        goodput: f.goodput.take(),
    };
    let per_tenant = f.tenants.as_ref().is_some_and(|t| !t.from.is_empty());
    let cost = cost_settings(f.cost.as_ref())?;
    let fleet_labels = match f.fleet_labels.take() {
        Some(labels) => labels.into_iter().map(LabelText::from).collect(),
        None => crate::slo::spec::default_fleet_labels(),
    };
    SloSet::validate(f.service.take(), f.period, f.min_events, file)
        .and_then(|set| set.with_fleet_labels(fleet_labels))
        .map(|set| SloSet {
            per_tenant,
            cost_slos: cost.slos,
            input_token_weight: cost.input_token_weight,
            ..set
        })
        .map_err(|(key, message)| ConfigError::invalid(&key, message))
}

pub(super) fn parse_yaml(text: &str) -> Result<FileConfig, String> {
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

/// A `decode_leg_sources` entry: an address or a CIDR range.
fn parse_source(text: &str) -> Result<ipnet::IpNet, ConfigError> {
    let text = text.trim();
    text.parse::<ipnet::IpNet>()
        .map(|net| net.trunc())
        .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| {
            ConfigError::invalid(
                "decode_leg_sources",
                format!("`{text}` is not an address or a CIDR range like 10.0.0.0/16"),
            )
        })
}
