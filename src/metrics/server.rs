//! The metrics port: `/metrics` (OpenMetrics text for Prometheus, protobuf with native
//! histograms for a scraper that prefers it, the classic text format for everyone else), `/healthz` (process up), `/readyz` (upstream answering).

use super::{classic_text, Metrics, OPENMETRICS_CONTENT_TYPE};
use crate::health::Readiness;
use crate::proto::PROTOBUF_CONTENT_TYPE;
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
            let (content_type, body) = match negotiate(request.headers().get(header::ACCEPT)) {
                Format::Protobuf => (PROTOBUF_CONTENT_TYPE, Bytes::from(metrics.encode_protobuf())),
                Format::OpenMetrics => (OPENMETRICS_CONTENT_TYPE, Bytes::from(metrics.encode())),
                Format::Classic => (
                    classic_text::CONTENT_TYPE,
                    Bytes::from(classic_text::from_openmetrics(&metrics.encode())),
                ),
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

/// The exposition formats of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// Prometheus's delimited protobuf, with native histograms.
    Protobuf,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Prometheus's classic text format 0.0.4.
    Classic,
}

/// The format `accept` ranks highest: protobuf only above every text format (what a
/// Prometheus with native histograms sends), OpenMetrics when asked for by name at least as
/// high as plain text (what every Prometheus sends), else the classic text, which is also
/// what a client with no preference (`*/*`, no header) gets.
fn negotiate(accept: Option<&HeaderValue>) -> Format {
    let Some(accept) = accept.and_then(|v| v.to_str().ok()) else {
        return Format::Classic;
    };
    let (mut protobuf, mut openmetrics, mut classic) = (0.0_f64, 0.0_f64, 0.0_f64);
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
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => classic = classic.max(q),
            _ => {}
        }
    }
    if protobuf > 0.0 && protobuf > openmetrics.max(classic) {
        Format::Protobuf
    } else if openmetrics > 0.0 && openmetrics >= classic {
        Format::OpenMetrics
    } else {
        Format::Classic
    }
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

    fn format(accept: &str) -> Format {
        negotiate(Some(&HeaderValue::from_str(accept).unwrap()))
    }

    #[test]
    fn protobuf_only_when_ranked_above_text() {
        // Prometheus 2.42 with native histograms enabled.
        assert_eq!(
            format(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,\
                 text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
            ),
            Format::Protobuf
        );
        // Prometheus 3 with `scrape_protocols: [PrometheusProto, OpenMetricsText1.0.0]`.
        assert_eq!(
            format(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,\
                 application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.4"
            ),
            Format::Protobuf
        );
        // Ranked below text, the wrong message, the length-prefix framing missing, q=0.
        for accept in [
            "text/plain;q=0.9,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5",
            "application/vnd.google.protobuf;proto=other.Message;encoding=delimited",
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily",
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0",
            "application/vnd.google.protobuf;;q=oops,,",
        ] {
            assert_ne!(format(accept), Format::Protobuf, "{accept}");
        }
    }

    #[test]
    fn openmetrics_when_asked_for_by_name_else_the_classic_text() {
        // Prometheus without native histograms.
        assert_eq!(
            format(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                 text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            ),
            Format::OpenMetrics
        );
        assert_eq!(format("application/openmetrics-text"), Format::OpenMetrics);
        // curl, promtool's users, a browser, an old scraper, no header.
        assert_eq!(format("*/*"), Format::Classic);
        assert_eq!(format("text/plain;version=0.0.4"), Format::Classic);
        assert_eq!(
            format("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
            Format::Classic
        );
        assert_eq!(
            format("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"),
            Format::Classic
        );
        assert_eq!(negotiate(None), Format::Classic);
    }
}
