//! Defaults for every key: each module's own (the module it configures owns them), and the
//! sidecar's.

use std::time::Duration;

pub use crate::engine::scrape::defaults::*;
pub use crate::health::defaults::*;
pub use crate::observe::models::DEFAULT_MAX_MODELS as MAX_MODELS;
pub use crate::proxy::defaults::*;
pub use crate::serve::defaults::*;

/// `listen`.
pub const LISTEN: &str = "0.0.0.0:8080";
/// `metrics_listen`.
pub const METRICS_LISTEN: &str = "0.0.0.0:9464";
/// `log`.
pub const LOG: &str = "info";
/// `final_scrape_grace`: the chart's and the manifests' scrape interval.
pub const FINAL_SCRAPE_GRACE: Duration = Duration::from_secs(15);
