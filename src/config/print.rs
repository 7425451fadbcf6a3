//! The effective configuration as YAML, for `llmslo check-config`.

use super::{Config, LogFormat};
use crate::cost::CostSettings;
use crate::metrics::buckets::BucketOverrides;
use crate::observe::tenants::SourceSetting;
use crate::otel::settings::OtelConfig;
use crate::serve::tls::TlsSource;
use std::time::Duration;

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
                entry.insert("name".into(), slo.name.to_string().into());
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
            .map(|&i| self.slos.slos[i].name.to_string().into())
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
            "per_request_slos": self.per_request_slos,
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
            "max_in_flight_per_client": self.max_in_flight_per_client,
            "max_event_bytes": self.max_event_bytes,
            "upstream_timeout": human(self.upstream_timeout),
            "stream_idle_timeout": human(self.stream_idle_timeout.unwrap_or_default()),
            "upstream_idle_timeout": human(self.upstream_idle_timeout),
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
            "fleet_labels": self.slos.fleet_labels.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
            "gpu": {
                "enabled": self.gpu.enabled,
                "interval": human(self.gpu.interval),
                "library_path": self.gpu.library_path,
                "processes": self.gpu.processes,
                "simulated": self.gpu.simulated,
            },
            "capacity": {"window": human(self.capacity_window)},
            "workload": {"recent_requests": self.recent_requests},
            "role": self.role.as_str(),
            "prefill_relay": self.prefill_relay.map(|a| a.to_string()),
            "prefill_pool": self.prefill_pool.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "decode_leg_sources": self.decode_leg_sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
        });
        let mut mapping: serde_yaml::Mapping = serde_json::from_value(value).expect("plain JSON maps to YAML");
        let mut put = |key: &str, value: serde_json::Value| {
            mapping.insert(
                key.into(),
                serde_json::from_value(value).expect("plain JSON maps to YAML"),
            );
        };
        match &self.tls {
            None => {}
            Some(TlsSource::SelfSigned) => put("tls", serde_json::json!({"self_signed": true})),
            Some(TlsSource::Files { cert, key }) => {
                put("tls", serde_json::json!({"cert_file": cert.path, "key_file": key.path}))
            }
        }
        if self.metrics_tls {
            put("metrics_tls", true.into());
        }
        if self.upstream_tls.is_set() {
            let t = &self.upstream_tls;
            let mut entry = serde_json::Map::new();
            if let Some(ca) = &t.ca_file {
                entry.insert("ca_file".into(), serde_json::json!(ca));
            }
            if let Some(name) = &t.server_name {
                entry.insert("server_name".into(), name.clone().into());
            }
            if t.insecure_skip_verify {
                entry.insert("insecure_skip_verify".into(), true.into());
            }
            put("upstream_tls", entry.into());
        }
        if let Some(t) = &self.prefill_tls {
            let mut entry = serde_json::Map::new();
            entry.insert("enabled".into(), true.into());
            if let Some(ca) = &t.ca_file {
                entry.insert("ca_file".into(), serde_json::json!(ca));
            }
            if t.insecure_skip_verify {
                entry.insert("insecure_skip_verify".into(), true.into());
            }
            put("prefill_tls", entry.into());
        }
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
        if !self.tenants.from.is_empty() {
            let from: Vec<serde_json::Value> = self
                .tenants
                .from
                .iter()
                .map(|source| match source {
                    SourceSetting::Header(name) => serde_json::json!({"header": name.as_str()}),
                    // The file, never its keys.
                    SourceSetting::ApiKeys { path, .. } => serde_json::json!({"api_keys": path}),
                    SourceSetting::Body(field) => serde_json::json!({"body": field.as_str()}),
                })
                .collect();
            let tenants = serde_json::json!({
                "from": from,
                "names": self.tenants.names,
                "max_tenants": self.tenants.max_tenants,
                "forget_after": humantime::format_duration(self.tenants.forget_after).to_string(),
                "gauges": self.tenants.gauges,
            });
            mapping.insert(
                "tenants".into(),
                serde_json::from_value(tenants).expect("plain JSON maps to YAML"),
            );
        }
        if self.cost != CostSettings::default() {
            let slos: Vec<serde_json::Value> = self
                .cost
                .slos
                .iter()
                .map(|slo| serde_json::json!({"name": slo.name, slo.kind.as_str(): slo.target}))
                .collect();
            let cost = serde_json::json!({
                "gpu_hour_price": self.cost.gpu_hour_price,
                "gpu_hour_prices": self.cost.gpu_hour_prices,
                "gpus": self.cost.gpus,
                "energy_price_per_kwh": self.cost.energy_price_per_kwh,
                "input_token_weight": self.cost.input_token_weight,
                "slos": slos,
            });
            mapping.insert(
                "cost".into(),
                serde_json::from_value(cost).expect("plain JSON maps to YAML"),
            );
        }
        mapping.insert("slos".into(), slos.into());
        let mut goodput = serde_yaml::Mapping::new();
        goodput.insert("require".into(), require.into());
        mapping.insert("goodput".into(), goodput.into());
        serde_yaml::to_string(&mapping).expect("a mapping serializes")
    }
}
