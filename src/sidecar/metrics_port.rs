//! The metrics port: `/metrics` (OpenMetrics text for Prometheus, protobuf with native
//! histograms for a scraper that prefers it, the classic text format for everyone else),
//! `/healthz` (process up), `/readyz` (upstream answering).

use crate::health::Readiness;
use crate::metrics::Metrics;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
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
            let (content_type, body) = metrics.page(request.headers().get(header::ACCEPT));
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

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("static response parts are valid")
}
