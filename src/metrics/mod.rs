//! Prometheus: the registry every reader registers its families in, and its encoding for
//! `/metrics` (OpenMetrics text, the classic text, protobuf with native histograms). The
//! registry only registers and encodes; the families of the request path are one reader of
//! the request record ([`requests::RequestFamilies`]), beside the others.

pub mod buckets;
pub mod classic_text;
pub mod config_status;
pub mod disagg;
pub mod format;
pub mod labels;
pub mod limits;
pub mod native;
mod order;
pub mod phases;
pub mod requests;

use crate::proto::{self, PROTOBUF_CONTENT_TYPE};
use format::Format;
use labels::BuildLabels;
pub use labels::{ClientTimeout, RefusalReason};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashSet;
use std::sync::Arc;

/// The content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where each reader registers its families before `/metrics` is served: the families, and
/// the native twins of those that keep exemplars (see [`native`]).
#[derive(Debug, Default)]
pub struct Registry {
    families: prometheus_client::registry::Registry,
    twins: prometheus_client::registry::Registry,
}

impl Registry {
    /// The registry proper, for families and collectors without native twins.
    pub fn families(&mut self) -> &mut prometheus_client::registry::Registry {
        &mut self.families
    }

    /// Every reader has registered: the process's own families (the config file's status,
    /// the build) go last, and the registry becomes what `/metrics` encodes, with `appended`'s
    /// families after llmslo's own.
    pub fn into_metrics(mut self, appended: Option<Arc<dyn Appended>>) -> Metrics {
        let config_status = config_status::ConfigStatus::new(true);
        config_status.register(&mut self.families);
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        self.families
            .register("llmslo_build_info", "llmslo build information", build_info);
        Metrics {
            registry: self,
            appended,
            scrapes: tokio::sync::watch::Sender::new(0),
            config_status,
        }
    }
}

/// Families from outside llmslo that `/metrics` carries after its own (the engine's page,
/// with `engine_metrics: merge`), without any whose names llmslo's own families take.
pub trait Appended: Send + Sync {
    /// The families as OpenMetrics text, given llmslo's own exposition `own`.
    fn text(&self, own: &str) -> String;
    /// The families as protobuf messages, given the names of llmslo's own families.
    fn protobuf(&self, own: &HashSet<String>) -> Vec<proto::MetricFamily>;
}

/// What `/metrics` encodes: every reader's families, registered.
pub struct Metrics {
    registry: Registry,
    appended: Option<Arc<dyn Appended>>,
    /// `/metrics` answers given so far (for the final scrape at shutdown).
    scrapes: tokio::sync::watch::Sender<u64>,
    config_status: config_status::ConfigStatus,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("appended", &self.appended.is_some())
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Whether the config file is in force (`llmslo_config_valid` and its reload gauges).
    pub fn config_status(&self) -> &config_status::ConfigStatus {
        &self.config_status
    }

    /// Notes one `/metrics` answer encoded.
    pub fn count_scrape(&self) {
        self.scrapes.send_modify(|n| *n += 1);
    }

    /// How many `/metrics` answers have been encoded, as it changes.
    pub fn scrapes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.scrapes.subscribe()
    }

    /// The page a scraper whose `Accept` header is `accept` gets: its content type and body.
    pub fn page(&self, accept: Option<&http::HeaderValue>) -> (&'static str, bytes::Bytes) {
        match format::negotiate(accept) {
            Format::Protobuf => (PROTOBUF_CONTENT_TYPE, self.encode_protobuf().into()),
            Format::OpenMetrics => (OPENMETRICS_CONTENT_TYPE, self.encode().into()),
            Format::Classic => (
                classic_text::CONTENT_TYPE,
                classic_text::from_openmetrics(&self.encode()).into(),
            ),
        }
    }

    /// The whole registry in the OpenMetrics text format, each family's series in label order;
    /// the appended families follow llmslo's.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry.families)
            .expect("writing to a String cannot fail");
        let mut out = order::sorted(&out);
        if let Some(appended) = &self.appended {
            let more = appended.text(&out);
            if let Some(end) = out.strip_suffix("# EOF\n").map(str::len) {
                out.truncate(end);
                out.push_str(&more);
                out.push_str("# EOF\n");
            }
        }
        out
    }

    /// The whole registry in Prometheus's protobuf exposition, every histogram with its native
    /// buckets as well as its classic ones; the appended families follow llmslo's.
    pub fn encode_protobuf(&self) -> Vec<u8> {
        native::encode_protobuf(&self.registry.families, &self.registry.twins, |own| {
            self.appended
                .as_ref()
                .map_or_else(Vec::new, |appended| appended.protobuf(own))
        })
    }
}
