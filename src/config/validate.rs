//! The checks of values that parse but cannot be used, each error naming its key.

use super::{Config, ConfigError};
use http::Uri;
use std::net::SocketAddr;
use std::time::Duration;

impl Config {
    /// Checks the values that parse but cannot be used.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
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
        if self.max_in_flight_per_client == 0 || self.max_in_flight_per_client > self.max_in_flight_requests {
            return Err(ConfigError::invalid(
                "max_in_flight_per_client",
                format!(
                    "must be from 1 to max_in_flight_requests ({})",
                    self.max_in_flight_requests
                ),
            ));
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
            ("upstream_idle_timeout", self.upstream_idle_timeout),
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
        if self.recent_requests > crate::workload::recent::MAX_RECENT_REQUESTS {
            return Err(ConfigError::invalid(
                "workload.recent_requests",
                format!(
                    "at most {} (each costs about {} bytes)",
                    crate::workload::recent::MAX_RECENT_REQUESTS,
                    crate::workload::recent::BYTES_PER_REQUEST
                ),
            ));
        }
        if self.metrics_tls && self.tls.is_none() {
            return Err(ConfigError::invalid(
                "metrics_tls",
                "serves the metrics port with the proxy's certificate: set tls too",
            ));
        }
        if self.prefill_relay.is_some() && self.role != crate::record::Role::Decode {
            return Err(ConfigError::invalid(
                "prefill_relay",
                "relays the prefill legs a decode pod's routing sidecar sends: set role: decode too",
            ));
        }
        if self.prefill_tls.is_some() && self.prefill_relay.is_none() {
            return Err(ConfigError::invalid(
                "prefill_tls",
                "is how the prefill relay speaks to the routing sidecar and the prefill pods: set prefill_relay too",
            ));
        }
        if self.prefill_relay.is_some() && self.prefill_pool.is_empty() {
            return Err(ConfigError::invalid(
                "prefill_relay",
                "needs prefill_pool: the prefill pods it may send legs to (their headless Service's DNS name, \
                 addresses or CIDR ranges, each with the port); the relay sends a leg nowhere else. Without a pool, \
                 leave the relay off: the prefill part is then counted as unmeasured",
            ));
        }
        if self
            .prefill_relay
            .is_some_and(|a| a.ip().is_unspecified() || a.port() == 0)
        {
            return Err(ConfigError::invalid(
                "prefill_relay",
                "the routing sidecar is told this address: give one it can reach, like 127.0.0.1:8299 or the pod's IP",
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

/// A listen address: `HOST:PORT`, or `:PORT` for every interface (as Go programs write it).
pub(super) fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
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

pub(super) fn parse_upstream(value: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = value
        .parse()
        .map_err(|e| ConfigError::invalid("upstream", format!("`{value}` is not a URI: {e}")))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(ConfigError::invalid(
            "upstream",
            format!("`{value}` must start with http:// or https://"),
        ));
    }
    if uri.authority().is_none() {
        return Err(ConfigError::invalid("upstream", format!("`{value}` has no host")));
    }
    if uri.query().is_some() {
        return Err(ConfigError::invalid("upstream", "must not have a query string"));
    }
    Ok(uri)
}
