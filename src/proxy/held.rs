//! A body that holds a share of a limit (a semaphore permit) for as long as it lives, so that
//! the share comes back when the body has been sent on or dropped, whichever comes first.

use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::OwnedSemaphorePermit;

/// `inner`, holding `permit` (a semaphore's, or any share that gives itself back when dropped)
/// until it is dropped.
pub struct Held<B, P = OwnedSemaphorePermit> {
    inner: B,
    _permit: Option<P>,
}

impl<B, P> Held<B, P> {
    /// Wraps `inner`, holding `permit` (when there is one) for its lifetime.
    pub fn new(inner: B, permit: Option<P>) -> Self {
        Self { inner, _permit: permit }
    }
}

impl<B: Body + Unpin, P: Unpin> Body for Held<B, P> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
