//! The observed response body: forwards every frame unchanged while the tracker watches.

use super::tracker::{End, RequestTracker};
use crate::body::{BoxError, StreamIdle};
use crate::record::Outcome;
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Instant;

/// Wraps an upstream body; frames pass through untouched and are timestamped as forwarded.
#[derive(Debug)]
pub struct ObservedBody<B> {
    inner: B,
    watch: Watch,
    /// Whether the forwarded bytes are the engine's own, so its size is theirs.
    unchanged: bool,
}

/// Whether the body is still watched. The trailers held at the end share the tracker's place,
/// so that a frame's first look at the body reads the one cache line it needs anyway: with
/// hundreds of streams, each stream's state has left the cache when its next frame comes.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "the tracker stays in place: boxing it would add the cache miss this layout saves"
)]
enum Watch {
    /// Frames go by the tracker.
    Tracking(RequestTracker),
    /// The request is recorded; the trailers, if any, wait for the last held bytes to go out.
    Ended(Option<Frame<Bytes>>),
}

impl Watch {
    fn tracker(&mut self) -> Option<&mut RequestTracker> {
        match self {
            Self::Tracking(tracker) => Some(tracker),
            Self::Ended(_) => None,
        }
    }
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
            unchanged: !tracker.rewrites_body(),
            watch: Watch::Tracking(tracker),
        };
        if body.inner.is_end_stream() {
            // An empty body may never be polled.
            body.finish(End::Complete, Instant::now());
        }
        body
    }

    fn finish(&mut self, end: End, now: Instant) {
        self.finish_holding(end, now, None);
    }

    /// Records the request (once) and holds `trailers` to be sent next.
    fn finish_holding(&mut self, end: End, now: Instant, trailers: Option<Frame<Bytes>>) {
        match std::mem::replace(&mut self.watch, Watch::Ended(trailers)) {
            Watch::Tracking(mut tracker) => tracker.finish(end, now),
            ended => self.watch = ended, // recorded already: what it holds stays
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
        match &mut this.watch {
            Watch::Tracking(tracker) => tracker.prefetch_stream_state(),
            Watch::Ended(trailers) => {
                if let Some(trailers) = trailers.take() {
                    return Poll::Ready(Some(Ok(trailers)));
                }
            }
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
                    let held = this.watch.tracker().and_then(RequestTracker::take_held);
                    this.finish(End::Complete, Instant::now());
                    return Poll::Ready(held.map(|bytes| Ok(Frame::data(bytes))));
                }
            };
            let now = Instant::now();
            let frame = match (frame.into_data(), this.watch.tracker()) {
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
                    let held = this.watch.tracker().and_then(RequestTracker::take_held);
                    return Poll::Ready(Some(Ok(match held {
                        Some(held) => {
                            this.finish_holding(End::Complete, now, Some(trailers));
                            Frame::data(held)
                        }
                        None => {
                            this.finish(End::Complete, now);
                            trailers
                        }
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
        !matches!(self.watch, Watch::Ended(Some(_))) && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        if self.unchanged {
            return inner;
        }
        // Rewritten bytes are at most the engine's, and their exact count is known only at the end.
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::limits::LimitCounters;
    use crate::observe::recorder::{Recorder, RecorderSettings};
    use crate::record::{Operation, Reader, Readers, RequestRecord};
    use http::{HeaderMap, HeaderValue, StatusCode};
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    /// Keeps how each request ended.
    #[derive(Debug, Default)]
    struct Outcomes(Mutex<Vec<Outcome>>);

    impl Reader for Outcomes {
        fn finished(&self, record: &RequestRecord) {
            self.0.lock().unwrap().push(record.outcome);
        }
    }

    /// A body that gives its frames one by one, then ends.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.pop_front().map(Ok))
        }
    }

    const CHUNK: &str = r#"data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;

    #[tokio::test]
    async fn bytes_held_at_the_trailers_go_out_first_and_the_request_is_recorded_once() {
        let outcomes = Arc::new(Outcomes::default());
        let readers = Readers::new(vec![outcomes.clone()]);
        let settings = RecorderSettings::default();
        let recorder = Arc::new(Recorder::new(
            &settings,
            readers,
            Arc::default(),
            None,
            LimitCounters::default(),
        ));
        let mut tracker = RequestTracker::start(recorder, Some("m"), Operation::Chat, Instant::now(), 1 << 16);
        // Cutting the usage chunk holds back an event until it is whole.
        tracker.strip_usage_chunk();
        let mut head = HeaderMap::new();
        head.insert("content-type", HeaderValue::from_static("text/event-stream"));
        tracker.on_response_head(StatusCode::OK, &head);
        let whole = format!("{CHUNK}\n\n");
        let unfinished = "data: {\"id\"";
        let mut trailers = HeaderMap::new();
        trailers.insert("x-engine-trailer", HeaderValue::from_static("done"));
        let frames = Frames(VecDeque::from([
            Frame::data(Bytes::from(format!("{whole}{unfinished}"))),
            Frame::trailers(trailers.clone()),
        ]));
        let mut body = ObservedBody::new(frames, tracker);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut next = || match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(frame) => frame.map(Result::unwrap),
            Poll::Pending => panic!("a body of ready frames never waits"),
        };
        assert_eq!(next().unwrap().into_data().unwrap(), whole.as_bytes());
        assert_eq!(
            next().unwrap().into_data().unwrap(),
            unfinished.as_bytes(),
            "the held bytes"
        );
        assert_eq!(
            outcomes.0.lock().unwrap().as_slice(),
            [Outcome::UpstreamError],
            "recorded at the trailers, its last event cut off"
        );
        assert_eq!(next().unwrap().into_trailers().unwrap(), trailers, "then the trailers");
        assert!(next().is_none());
        drop(body);
        assert_eq!(outcomes.0.lock().unwrap().len(), 1, "once, not again at the drop");
    }
}
