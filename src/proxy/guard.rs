//! The outermost layer: what a client may send, and what it gets back when anything below
//! fails. CONNECT is refused; a generation request's body is held to `max_body_bytes` (a
//! declared larger one is refused before a byte is read), to `request_body_timeout` between
//! reads and to `request_body_min_rate` on average; every error from below becomes an
//! OpenAI-shaped JSON answer, the client's fault first whenever its body failed.

use super::error::ProxyError;
use super::headers::content_length;
use super::request_body::{BodyDeadlines, ClientBody, ClientFault};
use super::ProxyBody;
use crate::observe::recorder::Recorder;
use crate::observe::tenants::BodyIds;
use crate::observe::tracker::{End, RequestTracker};
use crate::record::Operation;
use crate::record::Outcome;
use crate::upstream::BoxError;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

/// The client-facing limits and the upstream named in errors.
#[derive(Debug, Clone)]
pub struct GuardSettings {
    /// The upstream as configured, for error messages.
    pub upstream: String,
    /// Largest generation request body accepted (413 beyond it).
    pub max_body_bytes: u64,
    /// Longest gap between two reads of a request body (408 beyond it).
    pub request_body_timeout: Duration,
    /// Longest a whole request body may take to arrive (408 beyond it).
    pub request_body_total_timeout: Duration,
    /// Slowest a request body may arrive on average after its first `request_body_timeout`,
    /// in bytes per second (408 below it); 0 is no floor.
    pub request_body_min_rate: u64,
    /// How long the upstream may take to send a response head (named in 504 answers).
    pub upstream_timeout: Duration,
    /// Largest stream event interpreted (for the record of a refused request).
    pub max_event_bytes: usize,
}

/// Wraps services in [`Guard`].
#[derive(Debug, Clone)]
pub struct GuardLayer {
    shared: Arc<Shared>,
}

/// What every clone of the guard shares.
#[derive(Debug)]
struct Shared {
    recorder: Arc<Recorder>,
    settings: GuardSettings,
}

impl GuardLayer {
    /// Guards with `settings`, recording refused generation requests into `recorder`.
    pub fn new(recorder: Arc<Recorder>, settings: GuardSettings) -> Self {
        Self {
            shared: Arc::new(Shared { recorder, settings }),
        }
    }
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// Applies the client's limits and answers every failure below it; never fails itself.
#[derive(Debug, Clone)]
pub struct Guard<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> tower::Service<Request<Incoming>> for Guard<S>
where
    S: tower::Service<Request<ClientBody>, Response = Response<ProxyBody>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness below is waited for in the call, where a failure can be answered.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let t0 = Instant::now();
        let Shared { recorder, settings, .. } = &*self.shared;
        if request.method() == Method::CONNECT {
            return Box::pin(std::future::ready(Ok(ProxyError::ConnectRefused.into_response())));
        }
        let operation = Operation::of_request(&request);
        let (parts, body) = request.into_parts();
        let body_limit = operation.map_or(u64::MAX, |_| settings.max_body_bytes);
        if content_length(&parts.headers).is_some_and(|len| len > body_limit) {
            // Refused before a byte of the body is read: the upload need not finish first.
            let fault = ClientFault::TooLarge(body_limit);
            if let Some(operation) = operation {
                let mut tracker =
                    RequestTracker::start(recorder.clone(), None, operation, t0, settings.max_event_bytes);
                tracker.serving(
                    recorder.tenant(&parts.headers, BodyIds::default()),
                    recorder.targets(&parts.headers),
                );
                tracker.finish(End::Failed(Outcome::ClientError), Instant::now());
            }
            debug!(%fault, "request refused: the client's body");
            return Box::pin(std::future::ready(Ok(ProxyError::Client(fault).into_response())));
        }
        let body = ClientBody::new(
            body,
            BodyDeadlines {
                read_timeout: settings.request_body_timeout,
                total_timeout: settings.request_body_total_timeout,
                min_rate: settings.request_body_min_rate,
            },
            body_limit,
        )
        .counting_timeouts_in(recorder.limits().clone());
        let fault = body.fault();
        let inner = self.inner.clone();
        let shared = self.shared.clone();
        Box::pin(async move {
            let response = tower::ServiceExt::oneshot(inner, Request::from_parts(parts, body)).await;
            Ok(response.unwrap_or_else(|error| shared.error_response(error, fault.get().copied())))
        })
    }
}

impl Shared {
    /// The answer to an exchange that failed: the client's fault when its body failed on the
    /// way (whatever the upstream made of that), else what the error says; the sidecar's own
    /// refusals from below are counted here.
    fn error_response(&self, error: BoxError, client_fault: Option<ClientFault>) -> Response<ProxyBody> {
        if let Some(fault) = client_fault {
            debug!(%fault, "request refused: the client's body");
            return ProxyError::Client(fault).into_response();
        }
        let error = self.proxy_error(error);
        if let ProxyError::Overloaded(reason) = error {
            self.recorder.limits().count_refused(reason);
        }
        error.into_response()
    }

    /// What an error from below is, in the sidecar's terms.
    fn proxy_error(&self, error: BoxError) -> ProxyError {
        let settings = &self.settings;
        match error.downcast::<ProxyError>() {
            Ok(error) => *error,
            Err(error) if error.is::<tower::timeout::error::Elapsed>() => ProxyError::Timeout {
                upstream: settings.upstream.clone(),
                after: settings.upstream_timeout,
            },
            Err(error) => match error.downcast::<ClientFault>() {
                Ok(fault) => ProxyError::Client(*fault),
                Err(error) => ProxyError::Unavailable {
                    upstream: settings.upstream.clone(),
                    reason: crate::upstream::innermost_cause(error.as_ref()),
                    connect: false,
                },
            },
        }
    }
}
