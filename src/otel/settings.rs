//! What OTLP export does, from the standard `OTEL_*` environment variables and the same keys
//! under `otel:` in the config file (lowercase, without the `OTEL_` prefix). A variable that
//! is set wins over the file, as it does for every OpenTelemetry SDK.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// `otel:` as written in the config file: each key is an `OTEL_*` variable's name, lowercase
/// and without the prefix.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtelConfig {
    /// `OTEL_METRICS_EXPORTER`: `otlp` or `none` (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_exporter: Option<String>,
    /// `OTEL_TRACES_EXPORTER`: `otlp` or `none` (the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traces_exporter: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base URL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exporter_otlp_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default), `http/json` or `grpc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exporter_otlp_protocol: Option<String>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value,key=value`, sent with every export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exporter_otlp_headers: Option<String>,
    /// `OTEL_METRIC_EXPORT_INTERVAL`: milliseconds between metric exports (default 60000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_export_interval: Option<u64>,
    /// `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`: `explicit_bucket_histogram`
    /// (the default: the buckets of `/metrics`) or `base2_exponential_bucket_histogram`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exporter_otlp_metrics_default_histogram_aggregation: Option<String>,
    /// `OTEL_SERVICE_NAME` (default `llmslo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`: `key=value,key=value`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_attributes: Option<String>,
    /// `OTEL_TRACES_SAMPLER`: `parentbased_always_on` (the default), `always_on`, `always_off`,
    /// `traceidratio`, `parentbased_always_off` or `parentbased_traceidratio`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traces_sampler: Option<String>,
    /// `OTEL_TRACES_SAMPLER_ARG`: the ratio of the ratio samplers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traces_sampler_arg: Option<String>,
}

/// The wire protocol of OTLP export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (`/v1/traces`, `/v1/metrics`; port 4318).
    HttpProtobuf,
    /// JSON over HTTP.
    HttpJson,
    /// gRPC (port 4317).
    Grpc,
}

/// One signal's export: spans or metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalExport {
    /// How it travels.
    pub protocol: OtlpProtocol,
    /// The whole URL to send to, when the file names the endpoint; `None` leaves the
    /// endpoint to the `OTEL_EXPORTER_OTLP_*ENDPOINT` variables and the protocol's default.
    pub endpoint: Option<String>,
    /// Headers from the file; the variables' headers are read by the exporter itself.
    pub headers: BTreeMap<String, String>,
}

/// How a trace's spans are sampled, when the file says (the variables are read by the SDK).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    /// `always_on`.
    AlwaysOn,
    /// `always_off`.
    AlwaysOff,
    /// `traceidratio` with its ratio.
    Ratio(f64),
    /// `parentbased_always_on`.
    ParentBasedOn,
    /// `parentbased_always_off`.
    ParentBasedOff,
    /// `parentbased_traceidratio` with its ratio.
    ParentBasedRatio(f64),
}

/// Everything OTLP export does, resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OtelSettings {
    /// Span export, when `traces_exporter` is `otlp`.
    pub traces: Option<SignalExport>,
    /// Metric export, when `metrics_exporter` is `otlp`.
    pub metrics: Option<SignalExport>,
    /// The metric export interval, when the file sets it.
    pub metric_interval: Option<Duration>,
    /// Histograms exported as base-2 exponential histograms instead of with explicit buckets.
    pub exponential_histograms: bool,
    /// `service.name`, when no variable sets it.
    pub service_name: Option<String>,
    /// Resource attributes from the file, when no variable sets them.
    pub resource_attributes: Vec<(String, String)>,
    /// The sampler, when the file sets it and no variable does.
    pub sampler: Option<SamplerChoice>,
}

/// A setting that cannot be used: the key (or variable) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    /// `otel.<key>` or the variable's name.
    pub key: String,
    /// What is wrong and what is accepted.
    pub reason: String,
}

impl OtelSettings {
    /// Resolves the file's keys under the environment (`env` looks a variable up).
    pub fn resolve(file: &OtelConfig, env: impl Fn(&str) -> Option<String>) -> Result<Self, SettingError> {
        let lookup = Lookup { file, env: &env };
        let enabled = |key: &str, value: Option<(String, String)>| -> Result<bool, SettingError> {
            match value {
                None => Ok(false),
                Some((source, value)) => match value.trim() {
                    "otlp" => Ok(true),
                    "none" | "" => Ok(false),
                    other => Err(SettingError {
                        key: source,
                        reason: format!(
                            "`{other}` is not an exporter llmslo has: use `otlp` or `none` ({key}; Prometheus \
                             is always served on /metrics)"
                        ),
                    }),
                },
            }
        };
        let traces_on = enabled("traces", lookup.get("TRACES_EXPORTER", |f| f.traces_exporter.clone()))?;
        let metrics_on = enabled(
            "metrics",
            lookup.get("METRICS_EXPORTER", |f| f.metrics_exporter.clone()),
        )?;
        let signal = |name: &str, path: &str| -> Result<SignalExport, SettingError> {
            let upper = name.to_ascii_uppercase();
            let protocol = match env(&format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")) {
                Some(value) => parse_protocol(&format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"), &value)?,
                None => match lookup.get("EXPORTER_OTLP_PROTOCOL", |f| f.exporter_otlp_protocol.clone()) {
                    Some((source, value)) => parse_protocol(&source, &value)?,
                    None => OtlpProtocol::HttpProtobuf,
                },
            };
            let env_endpoint = env(&format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")).is_some()
                || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
            let endpoint = match (&file.exporter_otlp_endpoint, env_endpoint) {
                (Some(base), false) => Some(match protocol {
                    OtlpProtocol::Grpc => base.clone(),
                    _ => format!("{}/{path}", base.trim_end_matches('/')),
                }),
                _ => None,
            };
            let headers = match (&file.exporter_otlp_headers, env("OTEL_EXPORTER_OTLP_HEADERS")) {
                (Some(headers), None) => pairs("otel.exporter_otlp_headers", headers)?.into_iter().collect(),
                _ => BTreeMap::new(),
            };
            Ok(SignalExport {
                protocol,
                endpoint,
                headers,
            })
        };
        let metric_interval = match (file.metric_export_interval, env("OTEL_METRIC_EXPORT_INTERVAL")) {
            (Some(0), _) => {
                return Err(SettingError {
                    key: "otel.metric_export_interval".into(),
                    reason: "must be a positive number of milliseconds".into(),
                })
            }
            (Some(ms), None) => Some(Duration::from_millis(ms)),
            _ => None,
        };
        let exponential_histograms = match lookup.get("EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", |f| {
            f.exporter_otlp_metrics_default_histogram_aggregation.clone()
        }) {
            None => false,
            Some((source, value)) => match value.trim() {
                "explicit_bucket_histogram" | "" => false,
                "base2_exponential_bucket_histogram" => true,
                other => {
                    return Err(SettingError {
                        key: source,
                        reason: format!(
                            "`{other}` is not a histogram aggregation: use `explicit_bucket_histogram` or \
                             `base2_exponential_bucket_histogram`"
                        ),
                    })
                }
            },
        };
        let service_name = match env("OTEL_SERVICE_NAME") {
            Some(_) => None,
            None => Some(file.service_name.clone().unwrap_or_else(|| "llmslo".into())),
        };
        let resource_attributes = match (&file.resource_attributes, env("OTEL_RESOURCE_ATTRIBUTES")) {
            (Some(attributes), None) => pairs("otel.resource_attributes", attributes)?,
            _ => Vec::new(),
        };
        let sampler = match env("OTEL_TRACES_SAMPLER") {
            Some(_) => None,
            None => match &file.traces_sampler {
                Some(name) => Some(parse_sampler(name, file.traces_sampler_arg.as_deref())?),
                None => None,
            },
        };
        Ok(OtelSettings {
            traces: traces_on.then(|| signal("traces", "v1/traces")).transpose()?,
            metrics: metrics_on.then(|| signal("metrics", "v1/metrics")).transpose()?,
            metric_interval,
            exponential_histograms,
            service_name,
            resource_attributes,
            sampler,
        })
    }
}

/// A key's value from the environment when set, else from the file, with where it came from.
struct Lookup<'a, E> {
    file: &'a OtelConfig,
    env: &'a E,
}

impl<E: Fn(&str) -> Option<String>> Lookup<'_, E> {
    fn get(&self, key: &str, from_file: impl Fn(&OtelConfig) -> Option<String>) -> Option<(String, String)> {
        let variable = format!("OTEL_{key}");
        match (self.env)(&variable) {
            Some(value) => Some((variable, value)),
            None => from_file(self.file).map(|value| (format!("otel.{}", key.to_ascii_lowercase()), value)),
        }
    }
}

fn parse_protocol(source: &str, value: &str) -> Result<OtlpProtocol, SettingError> {
    match value.trim() {
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        "http/json" => Ok(OtlpProtocol::HttpJson),
        "grpc" => Ok(OtlpProtocol::Grpc),
        other => Err(SettingError {
            key: source.to_string(),
            reason: format!("`{other}` is not an OTLP protocol: use `http/protobuf`, `http/json` or `grpc`"),
        }),
    }
}

/// `key=value,key=value`, as the OTel variables write lists.
fn pairs(source: &str, text: &str) -> Result<Vec<(String, String)>, SettingError> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
            _ => Err(SettingError {
                key: source.to_string(),
                reason: "must be a list of key=value, separated by commas".into(),
            }),
        })
        .collect()
}

fn parse_sampler(name: &str, arg: Option<&str>) -> Result<SamplerChoice, SettingError> {
    let ratio = || -> Result<f64, SettingError> {
        match arg.map(|a| a.trim().parse::<f64>()) {
            None => Ok(1.0),
            Some(Ok(r)) if (0.0..=1.0).contains(&r) => Ok(r),
            Some(_) => Err(SettingError {
                key: "otel.traces_sampler_arg".into(),
                reason: "must be a ratio between 0 and 1".into(),
            }),
        }
    };
    Ok(match name.trim() {
        "always_on" => SamplerChoice::AlwaysOn,
        "always_off" => SamplerChoice::AlwaysOff,
        "traceidratio" => SamplerChoice::Ratio(ratio()?),
        "parentbased_always_on" => SamplerChoice::ParentBasedOn,
        "parentbased_always_off" => SamplerChoice::ParentBasedOff,
        "parentbased_traceidratio" => SamplerChoice::ParentBasedRatio(ratio()?),
        other => {
            return Err(SettingError {
                key: "otel.traces_sampler".into(),
                reason: format!(
                    "`{other}` is not a sampler llmslo has: use always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
                ),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(file: &str, env: &[(&str, &str)]) -> Result<OtelSettings, SettingError> {
        let file: OtelConfig = serde_yaml::from_str(file).unwrap();
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        OtelSettings::resolve(&file, |k| env.get(k).cloned())
    }

    #[test]
    fn off_unless_an_exporter_is_otlp() {
        let s = resolve("{}", &[]).unwrap();
        assert_eq!((s.traces, s.metrics), (None, None));
        let s = resolve("{traces_exporter: none}", &[("OTEL_METRICS_EXPORTER", "none")]).unwrap();
        assert_eq!((s.traces, s.metrics), (None, None));
    }

    #[test]
    fn the_file_sets_what_no_variable_sets() {
        let s = resolve(
            "{metrics_exporter: otlp, traces_exporter: otlp, exporter_otlp_endpoint: 'http://c:4318/', \
             exporter_otlp_headers: 'a=1, b=2', metric_export_interval: 500, service_name: chat, \
             resource_attributes: 'k8s.cluster.name=prod', traces_sampler: parentbased_traceidratio, \
             traces_sampler_arg: '0.25'}",
            &[],
        )
        .unwrap();
        let traces = s.traces.unwrap();
        assert_eq!(traces.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(traces.endpoint.as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(traces.headers.get("b").map(String::as_str), Some("2"));
        assert_eq!(s.metrics.unwrap().endpoint.as_deref(), Some("http://c:4318/v1/metrics"));
        assert_eq!(s.metric_interval, Some(Duration::from_millis(500)));
        assert_eq!(s.service_name.as_deref(), Some("chat"));
        assert_eq!(
            s.resource_attributes,
            [("k8s.cluster.name".to_string(), "prod".to_string())]
        );
        assert_eq!(s.sampler, Some(SamplerChoice::ParentBasedRatio(0.25)));
    }

    #[test]
    fn a_variable_wins_over_the_file() {
        let s = resolve(
            "{traces_exporter: none, exporter_otlp_endpoint: 'http://file:4318', exporter_otlp_protocol: grpc, \
             service_name: file, traces_sampler: always_off}",
            &[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317"),
                ("OTEL_SERVICE_NAME", "env"),
                ("OTEL_TRACES_SAMPLER", "always_on"),
            ],
        )
        .unwrap();
        let traces = s.traces.unwrap();
        assert_eq!(
            traces.protocol,
            OtlpProtocol::Grpc,
            "the file's protocol, no variable set one"
        );
        assert_eq!(traces.endpoint, None, "the exporter reads the variable itself");
        assert_eq!((s.service_name, s.sampler), (None, None));
        let s = resolve(
            "{traces_exporter: otlp, exporter_otlp_protocol: grpc}",
            &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")],
        )
        .unwrap();
        assert_eq!(s.traces.unwrap().protocol, OtlpProtocol::HttpJson);
    }

    #[test]
    fn histograms_are_exponential_when_asked_by_the_variable_or_the_file() {
        let variable = "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION";
        assert!(!resolve("{}", &[]).unwrap().exponential_histograms);
        assert!(
            resolve("{}", &[(variable, "base2_exponential_bucket_histogram")])
                .unwrap()
                .exponential_histograms
        );
        let file = "{exporter_otlp_metrics_default_histogram_aggregation: base2_exponential_bucket_histogram}";
        assert!(resolve(file, &[]).unwrap().exponential_histograms);
        assert!(
            !resolve(file, &[(variable, "explicit_bucket_histogram")])
                .unwrap()
                .exponential_histograms,
            "the variable wins"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let key = |file: &str, env: &[(&str, &str)]| resolve(file, env).unwrap_err().key;
        assert_eq!(key("{metrics_exporter: prometheus}", &[]), "otel.metrics_exporter");
        assert_eq!(key("{}", &[("OTEL_TRACES_EXPORTER", "jaeger")]), "OTEL_TRACES_EXPORTER");
        assert_eq!(
            key("{traces_exporter: otlp, exporter_otlp_protocol: udp}", &[]),
            "otel.exporter_otlp_protocol"
        );
        assert_eq!(
            key("{traces_exporter: otlp, exporter_otlp_headers: 'novalue'}", &[]),
            "otel.exporter_otlp_headers"
        );
        assert_eq!(key("{metric_export_interval: 0}", &[]), "otel.metric_export_interval");
        assert_eq!(key("{traces_sampler: sometimes}", &[]), "otel.traces_sampler");
        assert_eq!(
            key("{exporter_otlp_metrics_default_histogram_aggregation: native}", &[]),
            "otel.exporter_otlp_metrics_default_histogram_aggregation"
        );
        assert_eq!(
            key(
                "{}",
                &[(
                    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                    "exponential"
                )]
            ),
            "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"
        );
        assert_eq!(
            key("{traces_sampler: traceidratio, traces_sampler_arg: '2'}", &[]),
            "otel.traces_sampler_arg"
        );
        assert!(
            serde_yaml::from_str::<OtelConfig>("{exporter: otlp}").is_err(),
            "unknown keys are refused"
        );
    }
}
