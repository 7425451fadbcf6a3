//! The metrics port: `/metrics` (OpenMetrics text for Prometheus, protobuf with native
//! histograms for a scraper that prefers it, the classic text format for everyone else),
//! `/healthz` (process up), `/readyz` (upstream answering), `/workload` (the recent requests
//! as a trace, when kept).

use crate::health::Readiness;
use crate::metrics::Metrics;
use crate::workload::recent::RecentRequests;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::Arc;

/// What the metrics port serves.
#[derive(Debug, Clone)]
pub struct MetricsPort {
    /// Every reader's families.
    pub metrics: Arc<Metrics>,
    /// Whether the upstream answers.
    pub readiness: Arc<Readiness>,
    /// The recent requests, when kept (`workload.recent_requests`).
    pub workload: Option<Arc<RecentRequests>>,
}

/// What the metrics port answers with: a whole page, or one written as it is sent.
pub type PortBody = UnsyncBoxBody<Bytes, Infallible>;

/// Answers one request on the metrics port.
pub async fn handle<B>(request: Request<B>, port: MetricsPort) -> Result<Response<PortBody>, Infallible> {
    let MetricsPort {
        metrics,
        readiness,
        workload,
    } = port;
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
                .body(Full::new(body).boxed_unsync())
                .expect("static response parts are valid")
        }
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/workload" => match workload {
            Some(recent) => match recent.page().await {
                Some(page) => Response::builder()
                    .header(header::CONTENT_TYPE, "application/jsonl")
                    .body(page.boxed_unsync())
                    .expect("static response parts are valid"),
                None => busy(),
            },
            None => plain(
                StatusCode::NOT_FOUND,
                "no workload is kept: set workload.recent_requests in the config to keep the recent requests\n",
            ),
        },
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
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz, /readyz or /workload\n",
        ),
    })
}

fn plain(status: StatusCode, body: &'static str) -> Response<PortBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync())
        .expect("static response parts are valid")
}

/// The answer while as many `/workload` pages as may be are being written.
fn busy() -> Response<PortBody> {
    let mut response = plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "the workload's pages are all being written to other clients: retry in a second\n",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    response
}
