//! The client's request body on its way to the engine: a read timeout between frames, a size
//! limit, and a record of how it failed, so that a client's fault found while forwarding is
//! never taken for the engine's.

use super::idle::IdleTimer;
use super::UpstreamBody;
use crate::observe::record::Outcome;
use bytes::Bytes;
use http::StatusCode;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{sleep_until, Instant, Sleep};

/// Why a client's request body could not be read: always the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClientFault {
    /// The connection closed or reset before the body ended.
    #[error("the client stopped sending its request body before it ended")]
    Aborted,
    /// The body's framing is broken (a bad chunk size line, for instance).
    #[error("the request body's framing is malformed")]
    Malformed,
    /// No body bytes arrived for the read timeout.
    #[error("the client sent no request body bytes for {}", humantime::format_duration(*.0))]
    TimedOut(Duration),
    /// The whole body did not arrive within the total timeout.
    #[error("the client took longer than {} to send its request body", humantime::format_duration(*.0))]
    TooSlow(Duration),
    /// The body is larger than the limit for its route.
    #[error("the request body is larger than the limit of {0} bytes")]
    TooLarge(u64),
}

impl ClientFault {
    /// Classifies an error reading the body from the client: a fault it carries, broken
    /// framing, or else a client that went away.
    pub fn from_read_error(error: &(dyn std::error::Error + 'static)) -> Self {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if let Some(fault) = error.downcast_ref::<ClientFault>() {
                return *fault;
            }
            if let Some(io) = error.downcast_ref::<std::io::Error>() {
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
                ) {
                    return ClientFault::Malformed;
                }
            }
            cause = error.source();
        }
        ClientFault::Aborted
    }

    /// How the request is counted: a client that went away, or a client error.
    pub fn outcome(self) -> Outcome {
        match self {
            ClientFault::Aborted => Outcome::ClientCancelled,
            ClientFault::Malformed | ClientFault::TimedOut(_) | ClientFault::TooSlow(_) | ClientFault::TooLarge(_) => {
                Outcome::ClientError
            }
        }
    }

    /// The status the client is answered with (when it still listens).
    pub fn status(self) -> StatusCode {
        match self {
            ClientFault::Aborted | ClientFault::Malformed => StatusCode::BAD_REQUEST,
            ClientFault::TimedOut(_) | ClientFault::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            ClientFault::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

/// Where a [`ClientBody`] leaves its fault for the proxy to find after a failed forward.
pub type FaultSlot = Arc<OnceLock<ClientFault>>;

/// The client's body with read timeouts and a size limit; its failures are noted in a slot.
#[derive(Debug)]
pub struct ClientBody {
    inner: Incoming,
    timer: IdleTimer,
    read_timeout: Duration,
    /// When the whole body must have arrived, and the timer for it (armed on first wait).
    deadline: Instant,
    total_timeout: Duration,
    total_timer: Option<Pin<Box<Sleep>>>,
    received: u64,
    limit: u64,
    fault: FaultSlot,
}

impl ClientBody {
    /// Wraps `inner`: at most `limit` bytes, no gap between frames longer than `read_timeout`,
    /// and all of it within `total_timeout` from now.
    pub fn new(inner: Incoming, read_timeout: Duration, total_timeout: Duration, limit: u64) -> Self {
        Self {
            inner,
            timer: IdleTimer::new(Some(read_timeout)),
            read_timeout,
            deadline: Instant::now() + total_timeout,
            total_timeout,
            total_timer: None,
            received: 0,
            limit,
            fault: FaultSlot::default(),
        }
    }

    /// The slot that holds the body's fault once it failed.
    pub fn fault(&self) -> FaultSlot {
        self.fault.clone()
    }

    fn fail(&mut self, fault: ClientFault) -> Poll<Option<Result<Frame<Bytes>, ClientFault>>> {
        let _ = self.fault.set(fault);
        Poll::Ready(Some(Err(fault)))
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientFault;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ClientFault>>> {
        let this = self.get_mut();
        if let Some(fault) = this.fault.get() {
            return Poll::Ready(Some(Err(*fault)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.timer.touch();
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    if this.received > this.limit {
                        return this.fail(ClientFault::TooLarge(this.limit));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => this.fail(ClientFault::from_read_error(&error)),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.timer.poll_expired(cx).is_ready() {
                    return this.fail(ClientFault::TimedOut(this.read_timeout));
                }
                let deadline = this.deadline;
                let total = this.total_timer.get_or_insert_with(|| Box::pin(sleep_until(deadline)));
                match total.as_mut().poll(cx) {
                    Poll::Ready(()) => this.fail(ClientFault::TooSlow(this.total_timeout)),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Any request body, its failures taken as the client's faults and noted in a slot: how the
/// observer tells a client that broke off its upload from an engine that failed.
pub struct NotedBody {
    inner: UpstreamBody,
    fault: FaultSlot,
}

impl NotedBody {
    /// Wraps `inner`, noting its first failure in `fault`.
    pub fn new(inner: UpstreamBody, fault: FaultSlot) -> Self {
        Self { inner, fault }
    }
}

impl Body for NotedBody {
    type Data = Bytes;
    type Error = ClientFault;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ClientFault>>> {
        let this = self.get_mut();
        Pin::new(&mut this.inner).poll_frame(cx).map_err(|error| {
            let fault = ClientFault::from_read_error(error.as_ref());
            *this.fault.get_or_init(|| fault)
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
