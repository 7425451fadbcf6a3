//! The observed response body: forwards every frame unchanged while the tracker watches.

use super::tracker::{End, RequestTracker};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;

/// Wraps an upstream body; frames pass through untouched and are timestamped as forwarded.
#[derive(Debug)]
pub struct ObservedBody<B> {
    inner: B,
    tracker: Option<RequestTracker>,
}

impl<B: Body<Data = Bytes> + Unpin> ObservedBody<B> {
    /// Forwards `inner`, reporting what goes by to `tracker`.
    /// Dropping it before the end records `client_cancelled` (the tracker's drop).
    pub fn new(inner: B, tracker: RequestTracker) -> Self {
        let mut body = Self {
            inner,
            tracker: Some(tracker),
        };
        if body.inner.is_end_stream() {
            // An empty body may never be polled.
            body.finish(End::Complete, Instant::now());
        }
        body
    }

    fn finish(&mut self, end: End, now: Instant) {
        if let Some(mut tracker) = self.tracker.take() {
            tracker.finish(end, now);
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for ObservedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let now = Instant::now();
                if let (Some(data), Some(tracker)) = (frame.data_ref(), this.tracker.as_mut()) {
                    tracker.on_data(data, now);
                }
                if this.inner.is_end_stream() {
                    this.finish(End::Complete, now);
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish(End::BodyError, Instant::now()),
            Poll::Ready(None) => this.finish(End::Complete, Instant::now()),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
