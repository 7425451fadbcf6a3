//! The engine's response deadline, counted from when the request body has been sent: the time
//! a client takes to upload is the client's, never the engine's.

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
use tokio::sync::oneshot;
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
/// request body's end.
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
        let (sent, uploaded) = oneshot::channel();
        let request = request.map(|body| SentBody::new(body, sent).boxed_unsync());
        // Boxed before the async block, so that its future is provably Send (as the observer does).
        let response: InnerFuture<RB, S::Error> = Box::pin(self.inner.call(request));
        let after_upload = self.after_upload;
        // The body's end, or its drop (nothing more will be sent), starts the clock.
        let deadline = async move {
            let _ = uploaded.await;
            tokio::time::sleep(after_upload).await;
        };
        Box::pin(async move {
            tokio::select! {
                response = response => response.map_err(Into::into),
                () = deadline => Err(Elapsed::new().into()),
            }
        })
    }
}

type InnerFuture<RB, E> = Pin<Box<dyn Future<Output = Result<Response<RB>, E>> + Send>>;

/// A request body that says when its last byte has been taken.
struct SentBody {
    inner: UpstreamBody,
    sent: Option<oneshot::Sender<()>>,
}

impl SentBody {
    fn new(inner: UpstreamBody, sent: oneshot::Sender<()>) -> Self {
        let mut body = Self {
            inner,
            sent: Some(sent),
        };
        if body.inner.is_end_stream() {
            body.finished();
        }
        body
    }

    fn finished(&mut self) {
        if let Some(sent) = self.sent.take() {
            let _ = sent.send(());
        }
    }
}

impl Body for SentBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.finished();
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
}
