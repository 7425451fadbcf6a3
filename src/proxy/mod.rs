//! The forwarding proxy: classify the request, forward it to the one upstream, and wrap
//! the response body so the observer sees every frame.

pub mod client;
pub mod error;
pub mod headers;
pub mod idle;
pub mod peek;
pub mod request_body;

use crate::config::Engine;
use crate::metrics::{Metrics, RefusalReason};
use crate::observe::body::ObservedBody;
use crate::observe::record::{Operation, Outcome, Protocol};
use crate::observe::tokens::TokenCounter;
use crate::observe::tracker::{End, RequestTracker};
use crate::provider;
use bytes::Bytes;
use client::UpstreamClient;
use error::ProxyError;
use http::{header, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use idle::{BoxError, IdleTimeoutBody};
use peek::{PeekError, Peeked, RequestFields};
use request_body::{ClientBody, ClientFault};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::debug;

/// Body type sent to the upstream.
pub type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;
/// Body type sent back to the client.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Seconds a client refused for the buffer budget is asked to wait before retrying.
const RETRY_AFTER_SECS: u32 = 1;

/// Proxy settings taken from the configuration.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// The upstream as configured, for error messages.
    pub upstream: String,
    /// How much of a generation request body is read to learn model and stream.
    pub max_peek_bytes: usize,
    /// Largest generation request body accepted (413 beyond it).
    pub max_body_bytes: u64,
    /// Bytes of request bodies buffered by the peek at once, across all requests.
    pub max_buffered_request_bytes: usize,
    /// Longest gap between two reads of a request body (408 beyond it).
    pub request_body_timeout: Duration,
    /// Largest stream event (or JSON body) interpreted.
    pub max_event_bytes: usize,
    /// How long the upstream may take to send a response head.
    pub upstream_timeout: Duration,
    /// Longest silence of the upstream within a response body; `None` waits for ever.
    pub stream_idle_timeout: Option<Duration>,
    /// Ask streaming OpenAI requests for usage when they did not (and hide the answer).
    pub inject_usage: bool,
    /// The model's tokenizer, for streams that state no token counts.
    pub tokenizer: Option<Arc<TokenCounter>>,
}

/// Everything a proxied request needs, shared by all connections.
#[derive(Debug)]
pub struct Proxy {
    client: UpstreamClient,
    metrics: Arc<Metrics>,
    settings: ProxySettings,
    /// Bytes the peek may still buffer (`max_buffered_request_bytes` in all).
    budget: Arc<Semaphore>,
}

impl Proxy {
    /// A proxy to `client`'s upstream, recording into `metrics`.
    pub fn new(client: UpstreamClient, metrics: Arc<Metrics>, settings: ProxySettings) -> Self {
        Self {
            client,
            metrics,
            budget: Arc::new(Semaphore::new(settings.max_buffered_request_bytes)),
            settings,
        }
    }

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
        headers::remove_hop_by_hop(&mut parts.headers);
        let body_limit = operation.map_or(u64::MAX, |_| self.settings.max_body_bytes);
        let content_length = content_length(&parts.headers);
        if content_length.is_some_and(|len| len > body_limit) {
            // Refused before a byte of the body is read: the upload need not finish first.
            return Ok(self.refuse_client(operation, ClientFault::TooLarge(body_limit), t0));
        }
        let body = ClientBody::new(body, self.settings.request_body_timeout, body_limit);
        let fault = body.fault();
        let (body, fields, injected_usage) = match operation {
            Some(operation) => match self
                .read_generation_body(operation, &mut parts.headers, content_length, body)
                .await
            {
                Ok(read) => read,
                Err(PeekError::Client(fault)) => return Ok(self.refuse_client(Some(operation), fault, t0)),
                Err(PeekError::BudgetExhausted) => {
                    self.metrics.count_refused(RefusalReason::RequestBufferFull);
                    let error = ProxyError::Overloaded {
                        limit: "max_buffered_request_bytes",
                        retry_after: RETRY_AFTER_SECS,
                    };
                    return Ok(error.into_response());
                }
            },
            None => (
                body.map_err(|fault| Box::new(fault) as BoxError).boxed_unsync(),
                RequestFields::default(),
                false,
            ),
        };
        let mut tracker = self.track(operation, &fields, t0);
        if let Some(tracker) = tracker.as_mut() {
            debug!(
                operation = tracker.operation().as_str(),
                model = tracker.model(),
                stream = ?fields.stream,
                injected_usage,
                "measuring request"
            );
            if injected_usage {
                tracker.strip_usage_chunk();
            }
            if let Some(tokenizer) = &self.settings.tokenizer {
                tracker.count_with(tokenizer.clone());
            }
        }

        self.prepare_upstream_head(&mut parts, peer);
        let upstream_request = Request::from_parts(parts, body);
        let sent = tokio::time::timeout(self.settings.upstream_timeout, self.client.send(upstream_request)).await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Ok(self.forwarding_failed(tracker, &error, fault.get().copied())),
            Err(_) => {
                let error = ProxyError::Timeout {
                    upstream: self.settings.upstream.clone(),
                    after: self.settings.upstream_timeout,
                };
                return Ok(self.fail(tracker, Outcome::Timeout, error));
            }
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            // llmslo never forwards Upgrade, so no 101 was asked for: the engine misbehaved.
            let error = ProxyError::BadUpstreamResponse {
                upstream: self.settings.upstream.clone(),
                what: "101 Switching Protocols to a request that asked for no upgrade",
            };
            return Ok(self.fail(tracker, Outcome::UpstreamError, error));
        }
        let (mut parts, body) = response.into_parts();
        headers::remove_hop_by_hop(&mut parts.headers);
        self.learn_engine(operation, &parts);
        let body = IdleTimeoutBody::new(body, self.settings.stream_idle_timeout);
        let body = match tracker {
            Some(mut tracker) => {
                tracker.on_response_head(parts.status, &parts.headers);
                ObservedBody::new(body, tracker).boxed_unsync()
            }
            None => body.boxed_unsync(),
        };
        Ok(Response::from_parts(parts, body))
    }

    /// Answers an exchange that failed: the client's fault when its body failed on the way
    /// (whatever the upstream made of that), else the upstream's.
    fn forwarding_failed(
        &self,
        tracker: Option<RequestTracker>,
        error: &hyper_util::client::legacy::Error,
        client_fault: Option<ClientFault>,
    ) -> Response<ProxyBody> {
        if let Some(fault) = client_fault {
            return self.answer_client_fault(tracker, fault);
        }
        let outcome = if error.is_connect() {
            Outcome::ConnectError
        } else {
            Outcome::UpstreamError
        };
        let error = ProxyError::Unavailable {
            upstream: self.settings.upstream.clone(),
            reason: error::innermost_cause(error),
        };
        self.fail(tracker, outcome, error)
    }

    /// Answers a client fault found before forwarding, counting it when the route is measured.
    fn refuse_client(&self, operation: Option<Operation>, fault: ClientFault, t0: Instant) -> Response<ProxyBody> {
        let tracker = self.track(operation, &RequestFields::default(), t0);
        self.answer_client_fault(tracker, fault)
    }

    fn answer_client_fault(&self, tracker: Option<RequestTracker>, fault: ClientFault) -> Response<ProxyBody> {
        debug!(%fault, "request refused: the client's body");
        self.fail(tracker, fault.outcome(), ProxyError::Client(fault))
    }

    /// Peeks a generation request's body for its fields and, when due, asks it for usage
    /// (fixing Content-Length). Returns the body to send, the fields, and whether it was rewritten.
    async fn read_generation_body(
        &self,
        operation: Operation,
        headers: &mut http::HeaderMap,
        content_length: Option<u64>,
        body: ClientBody,
    ) -> Result<(UpstreamBody, RequestFields, bool), PeekError> {
        let max_peek = self.settings.max_peek_bytes;
        let (peeked, fields) = peek::peek(body, content_length, max_peek, &self.budget).await?;
        Ok(match peeked {
            Peeked::Whole(bytes, permit) => match self
                .should_inject_usage(operation, &fields)
                .then(|| peek::with_usage_requested(&bytes))
                .flatten()
            {
                Some(rewritten) => {
                    headers.insert(header::CONTENT_LENGTH, rewritten.len().into());
                    (peek::buffered(rewritten, permit), fields, true)
                }
                None => (peek::buffered(bytes, permit), fields, false),
            },
            Peeked::TooLarge(body) => (body, fields, false),
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
        headers::append_forwarded_for(&mut parts.headers, peer.ip());
    }

    fn fail(&self, tracker: Option<RequestTracker>, outcome: Outcome, error: ProxyError) -> Response<ProxyBody> {
        if let Some(mut tracker) = tracker {
            tracker.finish(End::Failed(outcome), Instant::now());
        }
        error.into_response()
    }
}

/// The request's declared Content-Length, when it has a valid one.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}
