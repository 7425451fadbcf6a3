//! The observed response body: forwards every frame unchanged while the tracker watches.

use super::tracker::{End, RequestTracker};
use crate::record::Outcome;
use crate::upstream::{BoxError, StreamIdle};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;

/// Wraps an upstream body; frames pass through untouched and are timestamped as forwarded.
#[derive(Debug)]
pub struct ObservedBody<B> {
    inner: B,
    tracker: Option<RequestTracker>,
    /// Trailers held back while the last held bytes go out first.
    trailers: Option<Frame<Bytes>>,
}

impl<B> ObservedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// Forwards `inner`, reporting what goes by to `tracker`.
    /// Dropping it before the end records `client_cancelled` (the tracker's drop).
    pub fn new(inner: B, tracker: RequestTracker) -> Self {
        let mut body = Self {
            inner,
            tracker: Some(tracker),
            trailers: None,
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

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(trailers)));
        }
        loop {
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(error)) => {
                    let error: BoxError = error.into();
                    // An engine gone quiet past `stream_idle_timeout` is a timeout, not a reset.
                    let end = if error.is::<StreamIdle>() {
                        End::Failed(Outcome::Timeout)
                    } else {
                        End::BodyError
                    };
                    this.finish(end, Instant::now());
                    return Poll::Ready(Some(Err(error)));
                }
                None => {
                    let held = this.tracker.as_mut().and_then(RequestTracker::take_held);
                    this.finish(End::Complete, Instant::now());
                    return Poll::Ready(held.map(|bytes| Ok(Frame::data(bytes))));
                }
            };
            let now = Instant::now();
            let frame = match (frame.into_data(), this.tracker.as_mut()) {
                (Ok(data), Some(tracker)) => match tracker.on_data(&data, now) {
                    None => Frame::data(data),
                    Some(mut forward) => {
                        if this.inner.is_end_stream() {
                            if let Some(held) = tracker.take_held() {
                                forward = [forward, held].concat().into();
                            }
                        }
                        if forward.is_empty() {
                            if this.inner.is_end_stream() {
                                this.finish(End::Complete, now);
                                return Poll::Ready(None);
                            }
                            continue; // only part of an event so far: wait for the rest
                        }
                        Frame::data(forward)
                    }
                },
                (Ok(data), None) => Frame::data(data),
                (Err(trailers), _) => {
                    // Trailers end a body: the server may never poll it again.
                    let held = this.tracker.as_mut().and_then(RequestTracker::take_held);
                    this.finish(End::Complete, now);
                    return Poll::Ready(Some(Ok(match held {
                        Some(held) => {
                            this.trailers = Some(trailers);
                            Frame::data(held)
                        }
                        None => trailers,
                    })));
                }
            };
            if this.inner.is_end_stream() {
                this.finish(End::Complete, now);
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.trailers.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
