//! The engine's deadlines: its response head within `upstream_timeout` of the request body's
//! end, and each piece of the request body taken within `upstream_timeout` of being offered.
//! The time a client takes to upload is the client's, never the engine's; an engine that stops
//! reading the body is the engine's, and holds it no longer than the deadline.

use super::UpstreamBody;
use crate::upstream::BoxError;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tower::timeout::error::Elapsed;

/// Wraps services in [`ResponseDeadline`].
#[derive(Debug, Clone, Copy)]
pub struct ResponseDeadlineLayer {
    after_upload: Duration,
}

impl ResponseDeadlineLayer {
    /// The response head must come within `after_upload` of the request body's end.
    pub fn new(after_upload: Duration) -> Self {
        Self { after_upload }
    }
}

impl<S> tower::Layer<S> for ResponseDeadlineLayer {
    type Service = ResponseDeadline<S>;

    fn layer(&self, inner: S) -> ResponseDeadline<S> {
        ResponseDeadline {
            inner,
            after_upload: self.after_upload,
        }
    }
}

/// Fails an exchange with [`Elapsed`] when `S` has not answered within the deadline of the
/// request body's end, or has not taken a piece of the body within the deadline of its offer.
#[derive(Debug, Clone)]
pub struct ResponseDeadline<S> {
    inner: S,
    after_upload: Duration,
}

impl<S, RB> tower::Service<Request<UpstreamBody>> for ResponseDeadline<S>
where
    S: tower::Service<Request<UpstreamBody>, Response = Response<RB>> + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: Send + 'static,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<UpstreamBody>) -> Self::Future {
        // The engine's turn from the start: it takes the head and the first piece.
        let (turn, upload) = watch::channel(Upload::Engine(Instant::now()));
        let request = request.map(|body| SentBody::new(body, turn).boxed_unsync());
        // Boxed before the async block, so that its future is provably Send (as the observer does).
        let response: InnerFuture<RB, S::Error> = Box::pin(self.inner.call(request));
        let deadline = engine_deadline(upload, self.after_upload);
        Box::pin(async move {
            tokio::select! {
                response = response => response.map_err(Into::into),
                () = deadline => Err(Elapsed::new().into()),
            }
        })
    }
}

type InnerFuture<RB, E> = Pin<Box<dyn Future<Output = Result<Response<RB>, E>> + Send>>;

/// Where the upload stands: whose turn it is, or over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upload {
    /// The engine asked for the next piece and waits on the client: the client's time.
    Client,
    /// A piece is offered (since then) and the engine has not asked for the next.
    Engine(Instant),
    /// The last byte was taken, or the body dropped (nothing more will be sent).
    Sent,
}

/// Completes when the engine missed a deadline: a piece of the body not taken within
/// `deadline` of its offer, or no response head within `deadline` of the body's end.
async fn engine_deadline(mut upload: watch::Receiver<Upload>, deadline: Duration) {
    loop {
        let state = *upload.borrow_and_update();
        match state {
            Upload::Sent => break,
            Upload::Client => {
                if upload.changed().await.is_err() {
                    break;
                }
            }
            Upload::Engine(since) => tokio::select! {
                changed = upload.changed() => if changed.is_err() { break },
                () = tokio::time::sleep_until(since + deadline) => return,
            },
        }
    }
    tokio::time::sleep(deadline).await;
}

/// A request body that says whose turn it is: it asked the client for a piece, offered one to
/// the engine, or was taken whole.
struct SentBody {
    inner: UpstreamBody,
    turn: watch::Sender<Upload>,
}

impl SentBody {
    fn new(inner: UpstreamBody, turn: watch::Sender<Upload>) -> Self {
        let body = Self { inner, turn };
        if body.inner.is_end_stream() {
            body.turn.send_replace(Upload::Sent);
        }
        body
    }
}

impl Body for SentBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let now = match &polled {
            _ if self.inner.is_end_stream() => Upload::Sent,
            Poll::Ready(None) => Upload::Sent,
            Poll::Ready(Some(_)) => Upload::Engine(Instant::now()),
            Poll::Pending => Upload::Client,
        };
        self.turn.send_if_modified(|turn| {
            let changed = *turn != now && *turn != Upload::Sent;
            if changed {
                *turn = now;
            }
            changed
        });
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use tower::{Layer, Service, ServiceExt};

    type Answer = Pin<Box<dyn Future<Output = Result<Response<()>, BoxError>> + Send>>;

    /// An engine that reads the whole request body, then answers after `think`.
    fn engine(think: Duration) -> tower::util::ServiceFn<impl FnMut(Request<UpstreamBody>) -> Answer> {
        tower::service_fn(move |request: Request<UpstreamBody>| -> Answer {
            Box::pin(async move {
                request.into_body().collect().await?;
                tokio::time::sleep(think).await;
                Ok(Response::new(()))
            })
        })
    }

    /// `pieces` one-byte frames, each after `gap`.
    struct Slow {
        pieces: usize,
        gap: Duration,
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    }

    impl Body for Slow {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            if self.pieces == 0 {
                return Poll::Ready(None);
            }
            let gap = self.gap;
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
            self.pieces -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
        }
    }

    fn slow_body(pieces: usize, gap: Duration) -> UpstreamBody {
        Slow {
            pieces,
            gap,
            sleep: None,
        }
        .boxed_unsync()
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_starts_when_the_upload_ends() {
        let mut service = ResponseDeadlineLayer::new(Duration::from_secs(1)).layer(engine(Duration::from_millis(900)));
        // A 5 s upload, then 0.9 s of thinking: within the deadline.
        let request = Request::new(slow_body(5, Duration::from_secs(1)));
        assert!(service.ready().await.unwrap().call(request).await.is_ok());
        // The engine thinking for 1.1 s after the upload is late.
        let mut late = ResponseDeadlineLayer::new(Duration::from_secs(1)).layer(engine(Duration::from_millis(1100)));
        let request = Request::new(
            Full::new(Bytes::from_static(b"{}"))
                .map_err(|e| match e {})
                .boxed_unsync(),
        );
        let error = late.ready().await.unwrap().call(request).await.unwrap_err();
        assert!(error.is::<Elapsed>());
    }

    /// An engine that takes one piece of the body every `every`, then answers at once.
    fn reading_engine(
        take: usize,
        every: Duration,
    ) -> tower::util::ServiceFn<impl FnMut(Request<UpstreamBody>) -> Answer> {
        tower::service_fn(move |request: Request<UpstreamBody>| -> Answer {
            Box::pin(async move {
                let mut body = request.into_body();
                for _ in 0..take {
                    tokio::time::sleep(every).await;
                    if body.frame().await.is_none() {
                        break;
                    }
                }
                // Then it stops reading, and never answers.
                std::future::pending::<()>().await;
                Ok(Response::new(()))
            })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_that_stops_taking_the_body_misses_its_deadline() {
        let deadline = Duration::from_secs(1);
        // Takes a piece every 0.9 s for 5 pieces, then stops: released 1 s after the last
        // piece it was offered, not never.
        let mut stalls = ResponseDeadlineLayer::new(deadline).layer(reading_engine(5, Duration::from_millis(900)));
        let request = Request::new(slow_body(100, Duration::ZERO));
        let start = Instant::now();
        let error = stalls.ready().await.unwrap().call(request).await.unwrap_err();
        assert!(error.is::<Elapsed>());
        assert_eq!(start.elapsed(), Duration::from_millis(5 * 900 + 1000));
        // A client that sends slowly is never the engine's fault: 5 s of gaps of 1 s each.
        let mut patient = ResponseDeadlineLayer::new(deadline).layer(engine(Duration::ZERO));
        let request = Request::new(slow_body(5, Duration::from_millis(1500)));
        assert!(patient.ready().await.unwrap().call(request).await.is_ok());
    }
}
