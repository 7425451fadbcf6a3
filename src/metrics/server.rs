//! The metrics port: `/metrics` (OpenMetrics text, or protobuf with native histograms for a
//! scraper that prefers it), `/healthz` (process up), `/readyz` (upstream answering).

use super::native::PROTOBUF_CONTENT_TYPE;
use super::{Metrics, OPENMETRICS_CONTENT_TYPE};
use crate::health::Readiness;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::Arc;

/// Answers one request on the metrics port.
pub async fn handle<B>(
    request: Request<B>,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n"));
    }
    Ok(match request.uri().path() {
        "/metrics" => {
            let (content_type, body) = if prefers_protobuf(request.headers().get(header::ACCEPT)) {
                (PROTOBUF_CONTENT_TYPE, Bytes::from(metrics.encode_protobuf()))
            } else {
                (OPENMETRICS_CONTENT_TYPE, Bytes::from(metrics.encode()))
            };
            metrics.count_scrape();
            Response::builder()
                .header(header::CONTENT_TYPE, content_type)
                .header(header::VARY, "Accept")
                .body(Full::new(body))
                .expect("static response parts are valid")
        }
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        // An invalid config file never makes the pod unready: traffic still flows without it.
        "/readyz" if readiness.is_ready() && !metrics.config_status().is_valid() => plain(
            StatusCode::OK,
            "ready; the config file is invalid, so the sidecar forwards without it (see the log and \
             llmslo_config_valid)\n",
        ),
        "/readyz" if readiness.is_ready() => plain(StatusCode::OK, "ready\n"),
        "/readyz" => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream has not answered its health path recently\n",
        ),
        _ => plain(StatusCode::NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n"),
    })
}

/// Whether `accept` ranks Prometheus's delimited protobuf above every text format: what a
/// Prometheus with native histograms enabled sends. Anything else, or no header, gets text.
fn prefers_protobuf(accept: Option<&HeaderValue>) -> bool {
    let Some(accept) = accept.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let (mut protobuf, mut text) = (0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or_default().to_ascii_lowercase();
        let (mut q, mut proto, mut delimited) = (1.0, false, false);
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => q = value.parse().unwrap_or(0.0),
                "proto" => proto = value == "io.prometheus.client.MetricFamily",
                "encoding" => delimited = value == "delimited",
                _ => {}
            }
        }
        match media_type.as_str() {
            "application/vnd.google.protobuf" if proto && delimited => protobuf = protobuf.max(q),
            "application/openmetrics-text" | "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    protobuf > 0.0 && protobuf > text
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefers(accept: &str) -> bool {
        prefers_protobuf(Some(&HeaderValue::from_str(accept).unwrap()))
    }

    #[test]
    fn protobuf_only_when_ranked_above_text() {
        // Prometheus 2.42 with native histograms enabled.
        assert!(prefers(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,\
             text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
        ));
        // Prometheus 3 with `scrape_protocols: [PrometheusProto, OpenMetricsText1.0.0]`.
        assert!(prefers(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,\
             application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.4"
        ));
        // Prometheus without native histograms, curl, a browser, no header.
        assert!(!prefers(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
             text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        ));
        assert!(!prefers("*/*"));
        assert!(!prefers_protobuf(None));
        // Ranked below text, the wrong message, the length-prefix framing missing, q=0.
        assert!(!prefers(
            "text/plain;q=0.9,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5"
        ));
        assert!(!prefers(
            "application/vnd.google.protobuf;proto=other.Message;encoding=delimited"
        ));
        assert!(!prefers(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily"
        ));
        assert!(!prefers(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0"
        ));
        assert!(!prefers("application/vnd.google.protobuf;;q=oops,,"));
    }
}
