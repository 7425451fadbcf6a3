//! A connection served until it ends or a stop gives it a grace to close in.

use crate::own_wake::OnOwnWake;
use crate::upstream::BoxError;
use hyper_util::server::graceful::GracefulConnection;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

/// Serves `connection` until it ends or `stop` gives a grace: then it is asked to close
/// gracefully (HTTP/2: GOAWAY; HTTP/1.1: after the response in flight), and dropped when the
/// grace passes first. `stop` is looked at when its own signal or timer fires, not at each of
/// the connection's wake-ups.
pub(super) fn until<C, S>(connection: C, stop: S) -> Until<C, S>
where
    C: GracefulConnection,
    C::Error: Into<BoxError>,
    S: Future<Output = Duration>,
{
    Until {
        connection,
        stop: Some(OnOwnWake::new(stop)),
        grace: None,
    }
}

pin_project_lite::pin_project! {
    /// What [`until`] returns. Written out rather than as an `async fn`, which would keep the
    /// connection twice (as its argument and as the pinned value it is moved into): a kilobyte
    /// per open connection.
    pub(super) struct Until<C, S> {
        #[pin]
        connection: C,
        // Until it gives a grace.
        stop: Option<OnOwnWake<S>>,
        // Once `stop` gave one: when the connection is dropped.
        #[pin]
        grace: Option<Sleep>,
    }
}

impl<C, S> Future for Until<C, S>
where
    C: GracefulConnection,
    C::Error: Into<BoxError>,
    S: Future<Output = Duration>,
{
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(served) = this.connection.as_mut().poll(cx) {
            return Poll::Ready(served.map_err(Into::into));
        }
        if let Some(stop) = this.stop.as_mut() {
            if let Poll::Ready(grace) = Pin::new(stop).poll(cx) {
                *this.stop = None;
                this.connection.as_mut().graceful_shutdown();
                this.grace.set(Some(tokio::time::sleep(grace)));
                // A close the connection can finish at once ends it now.
                if let Poll::Ready(served) = this.connection.as_mut().poll(cx) {
                    return Poll::Ready(served.map_err(Into::into));
                }
            }
        }
        match this.grace.as_pin_mut().map(|grace| grace.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    }
}
