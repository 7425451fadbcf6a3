//! The observer as a tower layer: wraps any HTTP service whose responses stream (an engine
//! client, a gateway's router) and records every generation request it passes into a
//! [`Recorder`], exactly as the sidecar does. It reads a generation request's body
//! far enough to learn its model (bounded, under a shared byte budget), forwards the same
//! bytes, and follows the response body frame by frame without changing it.
//!
//! ```no_run
//! use llmslo::{Measurement, MeasurementSettings, ObserveLayer, ObserveSettings};
//!
//! let measurement = Measurement::new(MeasurementSettings::default());
//! let layer = ObserveLayer::new(measurement.recorder.clone(), ObserveSettings::default());
//! // tower::ServiceBuilder::new().layer(layer).service(your_engine_client)
//! // and serve `measurement.metrics.encode()` on /metrics.
//! ```

use super::defaults;
use super::error::ProxyError;
use super::forward::ClientAddr;
use super::peek::{self, PeekError, Peeked, RequestFields};
use super::request_body::{ClientFault, FaultSlot, NotedBody};
use super::{ProxyBody, UpstreamBody};
use crate::body::{BoxError, Replayable, SendError};
use crate::metrics::RefusalReason;
use crate::observe::body::ObservedBody;
use crate::observe::recorder::Recorder;
use crate::observe::tenants::BodyIds;
use crate::observe::tokens::TokenCounter;
use crate::observe::tracker::{End, RequestTracker};
use crate::otel::context;
use crate::otel::spans::RequestSpans;
use crate::provider;
use crate::record::Engine;
use crate::record::Operation;
use crate::record::Outcome;
use crate::record::{names_prefill_pod, LegPhase, PrefillDiverter, PrefillTimer, RelaySkip, Role, Served};
use bytes::Bytes;
use http::{header, HeaderMap, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Body;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::debug;

/// How the observer reads requests and responses.
#[derive(Debug, Clone)]
pub struct ObserveSettings {
    /// How much of a generation request body is read to learn model and stream.
    pub max_peek_bytes: usize,
    /// Bytes of request bodies buffered by the peek at once, across all requests.
    pub max_buffered_request_bytes: usize,
    /// Largest stream event (or JSON body) interpreted.
    pub max_event_bytes: usize,
    /// Ask streaming OpenAI requests for usage when they did not (and hide the answer).
    pub inject_usage: bool,
    /// The model's tokenizer, for streams that state no token counts.
    pub tokenizer: Option<Arc<TokenCounter>>,
    /// Starts a span per generation request (OTLP traces on); without it, observations point
    /// at the client's own trace, when its `traceparent` names a sampled one.
    pub spans: Option<RequestSpans>,
    /// Relays the prefill legs of the requests it forwards, to time them (a decode pod's
    /// sidecar in front of the routing sidecar).
    pub relay: Option<Arc<dyn PrefillDiverter>>,
    /// Beside the pod itself (loopback), the clients whose requests may be decode legs on a
    /// decode pod: a router that sends legs from another pod (SGLang's, vLLM's).
    pub decode_leg_sources: Vec<ipnet::IpNet>,
}

impl Default for ObserveSettings {
    /// The sidecar's defaults, without a tokenizer.
    fn default() -> Self {
        Self {
            max_peek_bytes: defaults::MAX_PEEK_BYTES,
            max_buffered_request_bytes: defaults::MAX_BUFFERED_REQUEST_BYTES,
            max_event_bytes: defaults::MAX_EVENT_BYTES,
            inject_usage: defaults::INJECT_USAGE,
            tokenizer: None,
            spans: None,
            relay: None,
            decode_leg_sources: Vec::new(),
        }
    }
}

/// Wraps services in [`Observe`].
#[derive(Debug, Clone)]
pub struct ObserveLayer {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    recorder: Arc<Recorder>,
    settings: ObserveSettings,
    /// Bytes the peek may still buffer (`max_buffered_request_bytes` in all).
    budget: Arc<Semaphore>,
}

impl ObserveLayer {
    /// Records into `recorder`, reading requests and responses as `settings` say.
    pub fn new(recorder: Arc<Recorder>, settings: ObserveSettings) -> Self {
        Self {
            shared: Arc::new(Shared {
                recorder,
                budget: Arc::new(Semaphore::new(settings.max_buffered_request_bytes)),
                settings,
            }),
        }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Measures the generation requests that pass through `S`; every other request passes
/// untouched. Its own refusals (a request body the client broke off, a full buffer budget)
/// are answered with OpenAI-shaped JSON errors; `S`'s errors are passed on, counted.
#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B, RB> tower::Service<Request<B>> for Observe<S>
where
    S: tower::Service<Request<UpstreamBody>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Unpin + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ProxyBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let t0 = Instant::now();
        // The ready service answers this request; the clone waits for the next one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        let operation = Operation::of_request(&request);
        let Some(operation) = operation else {
            // Not measured: forwarded as it is; its response may still name the engine.
            let sent = call_inner(&mut inner, request.map(|body| body.map_err(Into::into).boxed_unsync()));
            return Box::pin(async move {
                let response = sent.await.map_err(Into::into)?;
                shared.learn_engine(None, &response);
                Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()))
            });
        };
        Box::pin(shared.observe(inner, operation, request, t0))
    }
}

impl Shared {
    /// Measures a generation request from its head to the end of its response.
    async fn observe<S, B, RB>(
        self: Arc<Self>,
        mut inner: S,
        operation: Operation,
        request: Request<B>,
        t0: Instant,
    ) -> Result<Response<ProxyBody>, BoxError>
    where
        S: tower::Service<Request<UpstreamBody>, Response = Response<RB>>,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
        RB: Body<Data = Bytes> + Unpin + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let (mut parts, body) = request.into_parts();
        let fault = FaultSlot::default();
        let body = NotedBody::new(body.map_err(Into::into).boxed_unsync(), fault.clone());
        let (body, fields, injected_usage) = match self.read_generation_body(operation, &mut parts, body).await {
            Ok(read) => read,
            Err(PeekError::Client(fault)) => {
                debug!(%fault, "request refused: the client's body");
                self.track(operation, &parts.headers, &RequestFields::default(), t0)
                    .finish(End::Failed(fault.outcome()), Instant::now());
                return Ok(ProxyError::Client(fault).into_response());
            }
            Err(PeekError::BudgetExhausted) => {
                self.recorder.limits().count_refused(RefusalReason::RequestBufferFull);
                return Ok(ProxyError::Overloaded(RefusalReason::RequestBufferFull).into_response());
            }
        };
        let peer = parts.extensions.get::<ClientAddr>().map(|ClientAddr(peer)| peer.ip());
        let (leg, ignored) = self.leg(&fields, peer);
        let mut tracker = match leg {
            Some(phase) => RequestTracker::start_leg(
                self.recorder.clone(),
                fields.model.as_deref(),
                operation,
                phase,
                t0,
                self.settings.max_event_bytes,
            ),
            None => {
                let mut tracker = self.track(operation, &parts.headers, &fields, t0);
                let (served, relay) = self.served(&mut parts.headers);
                tracker.served(served, relay);
                tracker.leg_fields_ignored(ignored);
                tracker
            }
        };
        if injected_usage {
            tracker.strip_usage_chunk();
        }
        if let Some(tokenizer) = &self.settings.tokenizer {
            tracker.count_with(tokenizer.clone());
        }
        match &self.settings.spans {
            Some(_) if leg.is_some() => {}
            Some(spans) => {
                let span = spans.start(&mut parts.headers, operation, tracker.model());
                tracker.trace_with(span);
            }
            None => tracker.link_client_trace(context::client_trace(&parts.headers)),
        }
        let response = match call_inner(&mut inner, Request::from_parts(parts, body)).await {
            Ok(response) => response,
            Err(error) => {
                let error: BoxError = error.into();
                // A client that broke off its upload is at fault, whatever the engine made of it.
                let (end, error) = match fault.get() {
                    Some(fault) => (End::Failed(fault.outcome()), Box::new(*fault) as BoxError),
                    None => (failure_end(&error), error),
                };
                tracker.finish(end, Instant::now());
                return Err(error);
            }
        };
        self.learn_engine(Some(operation), &response);
        let (mut parts, body) = response.into_parts();
        tracker.on_response_head(parts.status, &parts.headers);
        let rewritten = tracker.rewrites_body();
        if rewritten {
            // The engine's length counts the usage chunk the client will not get: the body goes
            // out chunked (HTTP/1.1) or framed by its end (h2), so every byte promised comes.
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        Ok(Response::from_parts(
            parts,
            ObservedBody::new(body, tracker).boxed_unsync(),
        ))
    }

    /// Peeks a generation request's body for its fields and, when due, asks it for usage
    /// (fixing Content-Length); a body read whole is kept beside it too, so that it can be sent
    /// again. Returns the body to send, the fields, and whether it was rewritten.
    async fn read_generation_body(
        &self,
        operation: Operation,
        parts: &mut http::request::Parts,
        body: NotedBody,
    ) -> Result<(UpstreamBody, RequestFields, bool), PeekError> {
        let headers = &mut parts.headers;
        if super::headers::is_multipart(headers) {
            // An upload (transcription audio) is forwarded at once, without a look.
            return Ok((peek::unread(body), RequestFields::default(), false));
        }
        let content_length = super::headers::content_length(headers);
        let max_peek = self.settings.max_peek_bytes;
        let (bytes, permit) = match peek::peek(body, content_length, max_peek, &self.budget).await? {
            Peeked::Whole(bytes, permit) => (bytes, permit),
            Peeked::TooLarge(body) => return Ok((body, RequestFields::default(), false)),
        };
        let fields = peek::parse_fields(&bytes, self.recorder.tenant_body_fields());
        let (bytes, permit, rewritten) = if self.should_inject_usage(operation, &fields) {
            match peek::with_usage_requested_within(bytes, permit, &self.budget) {
                Ok((rewritten, permit)) => {
                    headers.insert(header::CONTENT_LENGTH, rewritten.len().into());
                    (rewritten, permit, true)
                }
                Err((bytes, permit)) => (bytes, permit, false),
            }
        } else {
            (bytes, permit, false)
        };
        parts.extensions.insert(Replayable(bytes.clone()));
        Ok((peek::buffered(bytes, permit), fields, rewritten))
    }

    /// A streaming chat or completions request that did not ask for usage gets it asked for
    /// (the Responses and Messages APIs always report it).
    fn should_inject_usage(&self, operation: Operation, fields: &RequestFields) -> bool {
        self.settings.inject_usage
            && matches!(operation, Operation::Chat | Operation::TextCompletion)
            && fields.stream == Some(true)
            && !fields.asked_for_usage()
    }

    /// `engine: auto` learns from responses too: TGI's headers, or its native API answering.
    fn learn_engine<RB>(&self, operation: Option<Operation>, response: &Response<RB>) {
        let native_tgi =
            (operation == Some(Operation::Generate) && response.status().is_success()).then_some(Engine::Tgi);
        if let Some(engine) = provider::from_headers(response.headers()).or(native_tgi) {
            self.recorder.learn_engine(engine);
        }
    }

    /// The leg of a disaggregated request a request is, where the pod's role expects legs, and
    /// else the leg its fields claimed (it is then a user request, counted in full): a field a
    /// client sends never takes its request out of the user figures. Legs are as the request's
    /// `kv_transfer_params` say or, for SGLang's (`bootstrap_room`, sent to a prefill and a
    /// decode server at once), as the role says. A prefill pod takes legs from its routers
    /// anywhere; a decode pod takes decode legs only from itself (llm-d's routing sidecar sends
    /// them on loopback) or from `decode_leg_sources`, and no prefill legs.
    fn leg(&self, fields: &RequestFields, peer: Option<std::net::IpAddr>) -> (Option<LegPhase>, Option<LegPhase>) {
        let role = self.recorder.role();
        let claimed = fields.leg.or_else(|| {
            fields.bootstrap_room.then_some(match role {
                Role::Decode => LegPhase::Decode,
                Role::Aggregated | Role::Prefill | Role::Router => LegPhase::Prefill,
            })
        });
        let Some(claimed) = claimed else {
            return (None, None);
        };
        let expected = match (role, claimed) {
            (Role::Prefill, _) => true,
            (Role::Decode, LegPhase::Decode) => peer.is_some_and(|ip| {
                let ip = ip.to_canonical();
                ip.is_loopback() || self.settings.decode_leg_sources.iter().any(|net| net.contains(&ip))
            }),
            (Role::Decode, LegPhase::Prefill) | (Role::Aggregated | Role::Router, _) => false,
        };
        if expected {
            (Some(claimed), None)
        } else {
            (None, Some(claimed))
        }
    }

    /// How a user request is served: disaggregated when the router named a prefill pod (its
    /// leg then diverted to the relay, when there is one and the pod is of its pool), else as
    /// the pod's role says (every request in front of a P/D router is disaggregated).
    fn served(&self, headers: &mut HeaderMap) -> (Served, Result<Option<Box<dyn PrefillTimer>>, RelaySkip>) {
        if let Some(relay) = &self.settings.relay {
            relay.untag(headers);
        }
        if !names_prefill_pod(headers) {
            let served = match self.recorder.role() {
                Role::Decode => Served::DecodeOnly,
                Role::Router => Served::Disaggregated,
                Role::Aggregated | Role::Prefill => Served::Aggregated,
            };
            return (served, Ok(None));
        }
        let ticket = match &self.settings.relay {
            Some(relay) => relay.clone().divert_prefill(headers).map(Some),
            None => Ok(None),
        };
        (Served::Disaggregated, ticket)
    }

    /// Starts tracking a request with its model, its tenant and the targets it states.
    fn track(&self, operation: Operation, headers: &HeaderMap, fields: &RequestFields, t0: Instant) -> RequestTracker {
        let mut tracker = RequestTracker::start(
            self.recorder.clone(),
            fields.model.as_deref(),
            operation,
            t0,
            self.settings.max_event_bytes,
        );
        let body = BodyIds {
            safety_identifier: fields.safety_identifier.as_deref(),
            user: fields.user.as_deref(),
            metadata_user_id: fields.metadata_user_id.as_deref(),
        };
        tracker.serving(self.recorder.tenant(headers, body), self.recorder.targets(headers));
        tracker
    }
}

/// The inner service's answer as a boxed future: holding it (rather than `S::Future`) across
/// the observer's awaits keeps the observer's own future provably `Send`.
fn call_inner<S, RB>(inner: &mut S, request: Request<UpstreamBody>) -> InnerFuture<RB, S::Error>
where
    S: tower::Service<Request<UpstreamBody>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    Box::pin(inner.call(request))
}

type InnerFuture<RB, E> = Pin<Box<dyn Future<Output = Result<Response<RB>, E>> + Send>>;

/// How a request whose exchange failed ends: the sidecar's own refusals are not requests of
/// the SLOs; its other errors know their outcome; a tower timeout is a timeout; a client that
/// could not connect is a connect error; else the engine's.
fn failure_end(error: &BoxError) -> End {
    match error.downcast_ref::<ProxyError>() {
        Some(ProxyError::Overloaded(_)) => End::Refused,
        Some(error) => End::Failed(error.outcome()),
        None => End::Failed(failure_outcome(error)),
    }
}

/// The outcome of an error that is not one of the sidecar's own.
fn failure_outcome(error: &BoxError) -> Outcome {
    if let Some(fault) = error.downcast_ref::<ClientFault>() {
        return fault.outcome();
    }
    if error.is::<tower::timeout::error::Elapsed>() {
        return Outcome::Timeout;
    }
    // The sidecar's own client, or hyper-util's in an application that uses the layer.
    let connect = error.downcast_ref::<SendError>().is_some_and(|e| e.is_connect())
        || error
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(|e| e.is_connect());
    if connect {
        Outcome::ConnectError
    } else {
        Outcome::UpstreamError
    }
}
