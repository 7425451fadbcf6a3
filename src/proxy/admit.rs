//! Admission: a request takes one of the `max_in_flight_requests` slots when it is about to
//! reach the engine, after the observer has read what it peeks of the body, so a client
//! trickling its upload holds no slot; the slot is held until the response body has been sent
//! or dropped.

use super::error::ProxyError;
use super::held::Held;
use super::UpstreamBody;
use crate::metrics::RefusalReason;
use crate::upstream::BoxError;
use http::{Request, Response};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::Semaphore;
use tracing::debug;

/// Wraps services in [`Admit`].
#[derive(Debug, Clone)]
pub struct AdmitLayer {
    slots: Arc<Semaphore>,
    max: usize,
}

impl AdmitLayer {
    /// At most `max_in_flight_requests` requests past this layer at once.
    pub fn new(max_in_flight_requests: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight_requests)),
            max: max_in_flight_requests,
        }
    }
}

impl<S> tower::Layer<S> for AdmitLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            slots: self.slots.clone(),
            max: self.max,
        }
    }
}

/// Lets a request through when an in-flight slot is free, holding it on the response body;
/// fails with [`ProxyError::Overloaded`] otherwise (the engine never sees the request).
#[derive(Debug, Clone)]
pub struct Admit<S> {
    inner: S,
    slots: Arc<Semaphore>,
    max: usize,
}

impl<S, RB> tower::Service<Request<UpstreamBody>> for Admit<S>
where
    S: tower::Service<Request<UpstreamBody>, Response = Response<RB>, Error = BoxError>,
    S::Future: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<Held<RB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Held<RB>>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<UpstreamBody>) -> Self::Future {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            debug!(
                max_in_flight_requests = self.max,
                "request refused: at the in-flight cap"
            );
            return Box::pin(std::future::ready(Err(ProxyError::Overloaded(
                RefusalReason::InFlightLimit,
            )
            .into())));
        };
        // Boxed before the async block, so that its future is provably Send.
        let response: Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>> =
            Box::pin(self.inner.call(request));
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Held::new(body, Some(slot))))
        })
    }
}
