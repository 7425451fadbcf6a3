//! Whether the config file in force is the one on disk: the sidecar runs on (fail-open) when
//! it is not, and says so here, as Prometheus does for its own config.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

/// `llmslo_config_valid`, `llmslo_config_last_reload_successful` and its timestamp.
#[derive(Debug, Clone, Default)]
pub struct ConfigStatus {
    valid: Gauge,
    last_reload_successful: Gauge,
    last_success: Gauge<f64, AtomicU64>,
}

impl ConfigStatus {
    /// A status for a config loaded just now, `valid` or not.
    pub fn new(valid: bool) -> Self {
        let status = Self::default();
        status.loaded(valid);
        status
    }

    /// Records a load or reload of the file: whether it could be used.
    pub fn loaded(&self, valid: bool) {
        self.valid.set(i64::from(valid));
        self.last_reload_successful.set(i64::from(valid));
        if valid {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            self.last_success.set(now.as_secs_f64());
        }
    }

    /// Whether the file on disk is the config in force.
    pub fn is_valid(&self) -> bool {
        self.valid.get() == 1
    }

    /// Registers the three gauges.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "llmslo_config_valid",
            "1 when the config file (or its absence) is in force; 0 when it is invalid and the sidecar \
             forwards without it (no SLOs, default limits) or with the last good one after a bad reload",
            self.valid.clone(),
        );
        registry.register(
            "llmslo_config_last_reload_successful",
            "1 when the last load or reload of the config file succeeded",
            self.last_reload_successful.clone(),
        );
        registry.register(
            "llmslo_config_last_reload_success_timestamp_seconds",
            "When the config file was last loaded or reloaded successfully (Unix time)",
            self.last_success.clone(),
        );
    }
}

/// `llmslo_tenant_api_keys_valid` and `llmslo_tenant_api_keys`: whether every API-key table was
/// read at its last look (0: one could not be, and its last good table, or none, is in force),
/// and the keys in force.
#[derive(Debug, Clone, Default)]
pub struct KeyTablesStatus {
    valid: Gauge,
    keys: Gauge,
}

impl KeyTablesStatus {
    /// Records the tables' state.
    pub fn set(&self, valid: bool, keys: usize) {
        self.valid.set(i64::from(valid));
        self.keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// Registers the two gauges.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "llmslo_tenant_api_keys_valid",
            "1 when every API-key table was read at its last look; 0 when one could not be and its \
             last good table (none at start) is in force: requests with its keys are labelled by the next source",
            self.valid.clone(),
        );
        registry.register(
            "llmslo_tenant_api_keys",
            "API keys in force across the tenants' key tables",
            self.keys.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_reload_flips_both_gauges_and_keeps_the_last_success_time() {
        let status = ConfigStatus::new(true);
        let first = status.last_success.get();
        assert!(status.is_valid() && first > 0.0);
        status.loaded(false);
        assert!(!status.is_valid());
        assert_eq!(status.last_reload_successful.get(), 0);
        assert_eq!(status.last_success.get(), first);
    }
}
