//! The one engine the sidecar forwards to: the pooled HTTP client bound to it, the body
//! type sent to it, and how its failures read.

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, Error};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A boxed error, the error type of bodies that can fail in more than one way.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Body type sent to the upstream.
pub type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// The engine sent nothing on an open response body for `stream_idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing for {}", humantime::format_duration(*.0))]
pub struct StreamIdle(pub Duration);

/// The innermost cause of an error: "Connection refused" rather than "client error (Connect)".
pub fn innermost_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// How long a pooled upstream connection may sit idle.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long connecting to the upstream may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled HTTP/1.1 client bound to one upstream; it can reach no other target.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    client: Client<HttpConnector, UpstreamBody>,
    scheme: Scheme,
    authority: Authority,
    base_path: String,
    /// Woken when a request could not connect to the engine (the readiness probe listens).
    connect_failed: Arc<Notify>,
}

impl UpstreamClient {
    /// A client for `upstream` (an `http://host:port[/base]` URI, validated by the config)
    /// that keeps at most `max_idle` connections open between requests. Each request in
    /// flight holds one connection (HTTP/1.1), so with the proxy's in-flight cap as
    /// `max_idle`, connections to the engine never exceed about that cap.
    pub fn new(upstream: &Uri, max_idle: usize) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(max_idle)
            .build(connector);
        Self {
            client,
            scheme: upstream.scheme().cloned().unwrap_or(Scheme::HTTP),
            authority: upstream
                .authority()
                .cloned()
                .expect("validated upstream has an authority"),
            base_path: upstream.path().trim_end_matches('/').to_string(),
            connect_failed: Arc::default(),
        }
    }

    /// The upstream URI for a request's path and query; the client's URI never picks the target.
    pub fn uri_for(&self, path_and_query: &str) -> Uri {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build()
            .expect("an authority and an origin-form path make a valid URI")
    }

    /// Sends a request whose URI came from [`Self::uri_for`].
    pub async fn send(&self, request: Request<UpstreamBody>) -> Result<Response<Incoming>, Error> {
        let sent = self.client.request(request).await;
        if sent.as_ref().is_err_and(Error::is_connect) {
            self.connect_failed.notify_one();
        }
        sent
    }

    /// Completes when a request has failed to connect to the engine since the last call.
    pub async fn connect_failed(&self) {
        self.connect_failed.notified().await
    }

    /// GETs `path` on the upstream: its status and body (bounded to 1 MiB).
    pub async fn get(&self, path: &str) -> Result<(StatusCode, Bytes), Error> {
        let (status, body) = self.get_bounded(path, "*/*", 1 << 20).await?;
        Ok((status, body.unwrap_or_default()))
    }

    /// GETs `path` on the upstream asking for `accept`: its status, and its body unless it
    /// was longer than `limit` bytes or broke off (`None`).
    pub async fn get_bounded(
        &self,
        path: &str,
        accept: &str,
        limit: usize,
    ) -> Result<(StatusCode, Option<Bytes>), Error> {
        let request = Request::get(self.uri_for(path))
            .header(http::header::ACCEPT, accept)
            .body(Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync())
            .expect("a GET with a valid URI and a static header is a valid request");
        let response = self.send(request).await?;
        let status = response.status();
        // Copied into one buffer as the frames arrive: the page is held once, not as frames
        // and then again whole.
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let mut body = response.into_body();
        let mut page = Vec::with_capacity(declared.unwrap_or(0).min(limit));
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return Ok((status, None));
            };
            if let Ok(data) = frame.into_data() {
                if page.len() + data.len() > limit {
                    return Ok((status, None));
                }
                page.extend_from_slice(&data);
            }
        }
        Ok((status, Some(Bytes::from(page))))
    }
}
