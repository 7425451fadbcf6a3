//! Admission: a request takes one of the `max_in_flight_requests` slots when it is about to
//! reach the engine, after the observer has read what it peeks of the body, so a client
//! trickling its upload holds no slot; the slot is held until the response body has been sent
//! or dropped. One client address holds at most `max_in_flight_per_client` of them, so that no
//! one client (one that opens streams and never reads them, say) keeps the others out.

use super::error::ProxyError;
use super::forward::ClientAddr;
use super::held::Held;
use super::UpstreamBody;
use crate::metrics::RefusalReason;
use crate::upstream::BoxError;
use http::{Request, Response};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::debug;

/// Wraps services in [`Admit`].
#[derive(Debug, Clone)]
pub struct AdmitLayer {
    slots: Arc<Semaphore>,
    max: usize,
    clients: Arc<ClientShares>,
}

impl AdmitLayer {
    /// At most `max_in_flight_requests` requests past this layer at once, and at most
    /// `per_client` of them from one client address.
    pub fn new(max_in_flight_requests: usize, per_client: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight_requests)),
            max: max_in_flight_requests,
            clients: Arc::new(ClientShares {
                per_client,
                held: Mutex::default(),
            }),
        }
    }
}

/// The slots each client address holds (only addresses holding one are kept).
#[derive(Debug)]
struct ClientShares {
    per_client: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl ClientShares {
    /// One more slot for `client`, unless it holds its share.
    fn take(self: &Arc<Self>, client: IpAddr) -> Option<ClientSlot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(client).or_default();
        if *count >= self.per_client {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            shares: self.clone(),
            client,
        })
    }
}

/// What an admitted request holds until its response has been sent: its in-flight slot, and
/// its client's share of them (when its client is known).
pub type AdmitSlots = (OwnedSemaphorePermit, Option<ClientSlot>);

/// A client's slot, given back when dropped.
#[derive(Debug)]
pub struct ClientSlot {
    shares: Arc<ClientShares>,
    client: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
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
            clients: self.clients.clone(),
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
    clients: Arc<ClientShares>,
}

impl<S, RB> tower::Service<Request<UpstreamBody>> for Admit<S>
where
    S: tower::Service<Request<UpstreamBody>, Response = Response<RB>, Error = BoxError>,
    S::Future: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<Held<RB, AdmitSlots>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Held<RB, AdmitSlots>>, BoxError>> + Send>>;

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
        // A request from nowhere known (the layer used without the sidecar's accept loop) is
        // held to the overall cap alone.
        let client = request
            .extensions()
            .get::<ClientAddr>()
            .map(|ClientAddr(peer)| peer.ip());
        let share = match client.map(|client| self.clients.take(client)) {
            Some(None) => {
                debug!(
                    max_in_flight_per_client = self.clients.per_client,
                    "request refused: its client holds its share of the in-flight slots"
                );
                return Box::pin(std::future::ready(Err(ProxyError::Overloaded(
                    RefusalReason::ClientInFlightLimit,
                )
                .into())));
            }
            Some(share) => share,
            None => None,
        };
        // Boxed before the async block, so that its future is provably Send.
        let response: Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>> =
            Box::pin(self.inner.call(request));
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Held::new(body, Some((slot, share)))))
        })
    }
}
