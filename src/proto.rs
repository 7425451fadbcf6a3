//! Prometheus's protobuf exposition (`io.prometheus.client`): the one definition of its
//! messages and content type, shared by llmslo's registry and the merge of the engine's page.

pub use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::*;

/// The content type of the protobuf exposition (Prometheus's `io.prometheus.client` messages,
/// each preceded by its length).
pub const PROTOBUF_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";
