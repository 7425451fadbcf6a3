//! Idle timeouts for bodies in flight: a request body the client stops sending, a response
//! stream the engine stops sending. The timer is re-armed lazily, and looked at only when it
//! fires, so a busy stream costs one timestamp per frame and no timer-wheel update.

use crate::own_wake::OnOwnWake;
use crate::upstream::{BoxError, StreamIdle};
use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{sleep_until, Instant, Sleep};

/// Fires once no activity has been seen for its limit.
#[derive(Debug)]
pub struct IdleTimer {
    limit: Option<Duration>,
    last: Instant,
    sleep: Option<OnOwnWake<Sleep>>,
}

impl IdleTimer {
    /// A timer that fires after `limit` without activity; `None` never fires.
    pub fn new(limit: Option<Duration>) -> Self {
        Self {
            limit,
            last: Instant::now(),
            sleep: None,
        }
    }

    /// Notes activity now.
    pub fn touch(&mut self) {
        if self.limit.is_some() {
            self.last = Instant::now();
        }
    }

    /// Ready once the limit has passed since the last activity; registers the waker otherwise.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(limit) = self.limit else {
            return Poll::Pending;
        };
        let last = self.last;
        let sleep = self
            .sleep
            .get_or_insert_with(|| OnOwnWake::new(sleep_until(last + limit)));
        loop {
            ready!(Pin::new(&mut *sleep).poll(cx));
            // The timer was armed from an older activity: re-arm from the latest one.
            let deadline = self.last + limit;
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            sleep.change().reset(deadline);
        }
    }
}

/// A response body that fails with [`StreamIdle`] when the upstream goes quiet for too long.
#[derive(Debug)]
pub struct IdleTimeoutBody<B> {
    inner: B,
    timer: IdleTimer,
}

impl<B> IdleTimeoutBody<B> {
    /// Wraps `inner`; `limit` of `None` turns the timeout off.
    pub fn new(inner: B, limit: Option<Duration>) -> Self {
        Self {
            inner,
            timer: IdleTimer::new(limit),
        }
    }
}

impl<B> Body for IdleTimeoutBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.timer.touch();
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                ready!(this.timer.poll_expired(cx));
                let limit = this.timer.limit.unwrap_or_default();
                Poll::Ready(Some(Err(Box::new(StreamIdle(limit)))))
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    /// A body fed through a channel; it stays open while the sender lives.
    struct ChannelBody(mpsc::Receiver<Bytes>);

    impl Body for ChannelBody {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.get_mut().0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_body_fails_after_the_limit_and_a_busy_one_does_not() {
        let (tx, rx) = mpsc::channel(4);
        let mut body = IdleTimeoutBody::new(ChannelBody(rx), Some(Duration::from_secs(10)));
        let start = Instant::now();
        let feeder = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(8)).await;
                tx.send(Bytes::from_static(b"x")).await.unwrap();
            }
            std::future::pending::<()>().await; // keeps the sender: the body stays open
        });
        for _ in 0..5 {
            assert!(body.frame().await.unwrap().unwrap().is_data());
        }
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.is::<StreamIdle>(), "{error}");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(50),
            "40 s of 8 s gaps, then 10 s quiet"
        );
        feeder.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn no_limit_never_fires() {
        let (tx, rx) = mpsc::channel(1);
        let mut body = IdleTimeoutBody::new(ChannelBody(rx), None);
        let waited = tokio::time::timeout(Duration::from_secs(3600), body.frame()).await;
        assert!(waited.is_err(), "still waiting after an hour");
        drop(tx);
    }
}
