//! The client's request body on its way to the engine: a read timeout between frames, a
//! minimum average rate, a total timeout, a size limit, and a record of how it failed, so that
//! a client's fault found while forwarding is never taken for the engine's.

use super::UpstreamBody;
use crate::metrics::limits::LimitCounters;
use crate::metrics::ClientTimeout;
use crate::record::Outcome;
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
    /// The body arrived slower than the minimum rate, in bytes per second.
    #[error("the client sent its request body slower than {0} bytes per second")]
    BelowMinRate(u64),
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
            ClientFault::Malformed
            | ClientFault::TimedOut(_)
            | ClientFault::TooSlow(_)
            | ClientFault::BelowMinRate(_)
            | ClientFault::TooLarge(_) => Outcome::ClientError,
        }
    }

    /// The status the client is answered with (when it still listens).
    pub fn status(self) -> StatusCode {
        match self {
            ClientFault::Aborted | ClientFault::Malformed => StatusCode::BAD_REQUEST,
            ClientFault::TimedOut(_) | ClientFault::TooSlow(_) | ClientFault::BelowMinRate(_) => {
                StatusCode::REQUEST_TIMEOUT
            }
            ClientFault::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

/// Where a [`ClientBody`] leaves its fault for the proxy to find after a failed forward.
pub type FaultSlot = Arc<OnceLock<ClientFault>>;

/// The deadlines a request body is held to; each is renewed only by the body's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyDeadlines {
    /// Longest gap between two frames.
    pub read_timeout: Duration,
    /// Longest the whole body may take, from its head.
    pub total_timeout: Duration,
    /// After the first `read_timeout`, the body must have averaged at least this many bytes per
    /// second since its head; 0 is no floor.
    pub min_rate: u64,
}

impl BodyDeadlines {
    /// The first deadline a body that began at `start`, received `received` bytes and last
    /// made progress at `last` must meet, and the fault when it does not.
    fn next(&self, start: Instant, last: Instant, received: u64) -> (Instant, ClientFault) {
        let mut next = (start + self.total_timeout, ClientFault::TooSlow(self.total_timeout));
        let gap = (last + self.read_timeout, ClientFault::TimedOut(self.read_timeout));
        if gap.0 < next.0 {
            next = gap;
        }
        if self.min_rate > 0 {
            // Every byte buys 1/min_rate of a second beyond the grace.
            let earned = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
            let rate = (
                start + self.read_timeout + earned,
                ClientFault::BelowMinRate(self.min_rate),
            );
            if rate.0 < next.0 {
                next = rate;
            }
        }
        next
    }
}

/// The client's body under its [`BodyDeadlines`] and a size limit; its failures are noted in
/// a slot.
#[derive(Debug)]
pub struct ClientBody {
    inner: Incoming,
    deadlines: BodyDeadlines,
    start: Instant,
    last: Instant,
    /// The timer for the next deadline (armed on the first wait, moved lazily).
    timer: Option<Pin<Box<Sleep>>>,
    received: u64,
    limit: u64,
    fault: FaultSlot,
    limits: Option<LimitCounters>,
}

impl ClientBody {
    /// Wraps `inner`: at most `limit` bytes, within `deadlines` counted from now.
    pub fn new(inner: Incoming, deadlines: BodyDeadlines, limit: u64) -> Self {
        let now = Instant::now();
        Self {
            inner,
            deadlines,
            start: now,
            last: now,
            timer: None,
            received: 0,
            limit,
            fault: FaultSlot::default(),
            limits: None,
        }
    }

    /// Counts each deadline the body misses in `metrics`.
    pub fn counting_timeouts_in(mut self, limits: LimitCounters) -> Self {
        self.limits = Some(limits);
        self
    }

    /// The slot that holds the body's fault once it failed.
    pub fn fault(&self) -> FaultSlot {
        self.fault.clone()
    }

    fn fail(&mut self, fault: ClientFault) -> Poll<Option<Result<Frame<Bytes>, ClientFault>>> {
        let _ = self.fault.set(fault);
        Poll::Ready(Some(Err(fault)))
    }

    /// Ready with the fault once the next deadline has passed; registers the waker otherwise.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<ClientFault> {
        loop {
            let (deadline, fault) = self.deadlines.next(self.start, self.last, self.received);
            if Instant::now() >= deadline {
                if let Some(limits) = &self.limits {
                    limits.count_client_timeout(ClientTimeout::RequestBody);
                }
                return Poll::Ready(fault);
            }
            let timer = self.timer.get_or_insert_with(|| Box::pin(sleep_until(deadline)));
            if timer.deadline() != deadline {
                timer.as_mut().reset(deadline);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
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
                this.last = Instant::now();
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
            Poll::Pending => match this.poll_deadline(cx) {
                Poll::Ready(fault) => this.fail(fault),
                Poll::Pending => Poll::Pending,
            },
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
