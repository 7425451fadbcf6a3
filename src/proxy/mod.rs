//! The forwarding proxy: classify the request, forward it to the one upstream, and wrap
//! the response body so the observer sees every frame.

pub mod client;
pub mod error;
pub mod headers;
pub mod peek;

use crate::config::Engine;
use crate::metrics::Metrics;
use crate::observe::body::ObservedBody;
use crate::observe::record::{Operation, Outcome, Protocol};
use crate::observe::tracker::{End, RequestTracker};
use crate::provider;
use bytes::Bytes;
use client::UpstreamClient;
use error::ProxyError;
use http::{header, HeaderValue, Method, Request, Response, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use peek::{Peeked, RequestFields};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

/// Body type sent to the upstream.
pub type UpstreamBody = UnsyncBoxBody<Bytes, hyper::Error>;
/// Body type sent back to the client.
pub type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

/// Proxy settings taken from the configuration.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// The upstream as configured, for error messages.
    pub upstream: String,
    /// How much of a generation request body is read to learn model and stream.
    pub max_peek_bytes: usize,
    /// Largest stream event (or JSON body) interpreted.
    pub max_event_bytes: usize,
    /// How long the upstream may take to send a response head.
    pub upstream_timeout: Duration,
    /// Ask streaming OpenAI requests for usage when they did not (and hide the answer).
    pub inject_usage: bool,
}

/// Everything a proxied request needs, shared by all connections.
#[derive(Debug)]
pub struct Proxy {
    /// The pooled client to the upstream.
    pub client: UpstreamClient,
    /// Where measurements go.
    pub metrics: Arc<Metrics>,
    /// Limits and timeouts.
    pub settings: ProxySettings,
}

impl Proxy {
    /// Forwards one client request and returns the (observed) response.
    pub async fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response<ProxyBody>, Infallible> {
        let t0 = Instant::now();
        if request.method() == Method::CONNECT {
            return Ok(ProxyError::ConnectRefused.into_response());
        }
        let operation = match *request.method() {
            Method::POST => Operation::from_path(request.uri().path()),
            _ => None,
        };
        let (mut parts, body) = request.into_parts();
        let (body, fields, injected_usage) = match operation {
            Some(operation) => match self.read_generation_body(operation, &mut parts.headers, body).await {
                Ok(read) => read,
                Err(error) => {
                    // The client stopped sending its body: nothing reached the engine.
                    if let Some(mut tracker) = self.track(Some(operation), &RequestFields::default(), t0) {
                        tracker.finish(End::Cancelled, Instant::now());
                    }
                    return Ok(ProxyError::BadRequestBody(error.to_string()).into_response());
                }
            },
            None => (body.boxed_unsync(), RequestFields::default(), false),
        };
        let mut tracker = self.track(operation, &fields, t0);
        if let Some(tracker) = tracker.as_mut() {
            debug!(
                operation = operation.map_or("", Operation::as_str),
                model = ?fields.model,
                stream = ?fields.stream,
                injected_usage,
                "measuring request"
            );
            if injected_usage {
                tracker.strip_usage_chunk();
            }
        }

        self.prepare_upstream_head(&mut parts, peer);
        let upstream_request = Request::from_parts(parts, body);
        let response =
            match tokio::time::timeout(self.settings.upstream_timeout, self.client.send(upstream_request)).await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => {
                    let outcome = if error.is_connect() {
                        Outcome::ConnectError
                    } else {
                        Outcome::UpstreamError
                    };
                    return Ok(self.fail(tracker, outcome, reason(&error)));
                }
                Err(_) => {
                    if let Some(tracker) = tracker.as_mut() {
                        tracker.finish(End::Failed(Outcome::Timeout), Instant::now());
                    }
                    let error = ProxyError::Timeout {
                        upstream: self.settings.upstream.clone(),
                        after: self.settings.upstream_timeout,
                    };
                    return Ok(error.into_response());
                }
            };
        let (mut parts, body) = response.into_parts();
        headers::remove_hop_by_hop(&mut parts.headers);
        self.learn_engine(operation, &parts);
        let body = match tracker {
            Some(mut tracker) => {
                tracker.on_response_head(parts.status, &parts.headers);
                ObservedBody::new(body, tracker).boxed_unsync()
            }
            None => body.boxed_unsync(),
        };
        Ok(Response::from_parts(parts, body))
    }

    /// Peeks a generation request's body for its fields and, when due, asks it for usage
    /// (fixing Content-Length). Returns the body to send, the fields, and whether it was rewritten.
    async fn read_generation_body(
        &self,
        operation: Operation,
        headers: &mut http::HeaderMap,
        body: Incoming,
    ) -> Result<(UpstreamBody, RequestFields, bool), hyper::Error> {
        let content_length = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let (peeked, fields) = peek::peek(body, content_length, self.settings.max_peek_bytes).await?;
        let rewritten = match &peeked {
            Peeked::Whole(bytes) if self.should_inject_usage(operation, &fields) => peek::with_usage_requested(bytes),
            _ => None,
        };
        Ok(match rewritten {
            Some(rewritten) => {
                headers.insert(header::CONTENT_LENGTH, rewritten.len().into());
                (peek::full(rewritten), fields, true)
            }
            None => (peeked.into_body(), fields, false),
        })
    }

    /// A streaming OpenAI request that did not ask for usage gets it asked for.
    fn should_inject_usage(&self, operation: Operation, fields: &RequestFields) -> bool {
        self.settings.inject_usage
            && operation.protocol() == Protocol::OpenAi
            && fields.stream == Some(true)
            && !fields.asked_for_usage()
    }

    /// `engine: auto` learns from responses too: TGI's headers, or its native API answering.
    fn learn_engine(&self, operation: Option<Operation>, response: &http::response::Parts) {
        let native_tgi =
            (operation == Some(Operation::Generate) && response.status.is_success()).then_some(Engine::Tgi);
        if let Some(engine) = provider::from_headers(&response.headers).or(native_tgi) {
            self.metrics.learn_engine(engine);
        }
    }

    fn track(&self, operation: Option<Operation>, fields: &RequestFields, t0: Instant) -> Option<RequestTracker> {
        operation.map(|operation| {
            RequestTracker::start(
                self.metrics.clone(),
                fields.model.as_deref(),
                operation,
                t0,
                self.settings.max_event_bytes,
            )
        })
    }

    /// Points the request at the upstream: origin-form URI, HTTP/1.1, end-to-end headers only.
    fn prepare_upstream_head(&self, parts: &mut http::request::Parts, peer: SocketAddr) {
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        // An HTTP/2 client names the host in :authority; HTTP/1.1 engines expect a Host header.
        if !parts.headers.contains_key(header::HOST) {
            if let Some(host) = parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                parts.headers.insert(header::HOST, host);
            }
        }
        parts.uri = self.client.uri_for(path_and_query);
        parts.version = Version::HTTP_11;
        headers::remove_hop_by_hop(&mut parts.headers);
        headers::append_forwarded_for(&mut parts.headers, peer.ip());
    }

    fn fail(&self, tracker: Option<RequestTracker>, outcome: Outcome, reason: String) -> Response<ProxyBody> {
        if let Some(mut tracker) = tracker {
            tracker.finish(End::Failed(outcome), Instant::now());
        }
        ProxyError::Unavailable {
            upstream: self.settings.upstream.clone(),
            reason,
        }
        .into_response()
    }
}

/// The innermost cause of a client error: "Connection refused" rather than "client error (Connect)".
fn reason(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
