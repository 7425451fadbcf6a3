//! The engine's response body, which drives the connection it came on from the task that
//! reads it: every frame the engine's last read brought is ready at once, so the client's
//! connection writes them together. At its end the connection is parked for the next request.

use super::pool::{Carrier, Pool};
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};

/// A response body from the engine, with the connection it arrives on.
#[derive(Debug)]
pub struct ResponseBody {
    incoming: Incoming,
    /// What the body arrives on, until it ends (an HTTP/1.1 connection is then parked).
    carrier: Option<Carrier>,
    pool: Weak<Pool>,
}

impl ResponseBody {
    /// `incoming`, arriving on `carrier`, which goes back to `pool` at its end.
    pub fn new(incoming: Incoming, carrier: Carrier, pool: Weak<Pool>) -> Self {
        Self {
            incoming,
            carrier: Some(carrier),
            pool,
        }
    }
}

impl ResponseBody {
    /// The body has ended: its HTTP/1.1 connection goes back to the pool (which closes it when
    /// it cannot take another request), its HTTP/2 stream's place is given back.
    fn park(&mut self, cx: &mut Context<'_>) {
        if let (Some(Carrier::Connection(conn)), Some(pool)) = (self.carrier.take(), self.pool.upgrade()) {
            pool.park(conn, cx);
        }
    }
}

impl Drop for ResponseBody {
    /// A body dropped whole (one that was empty, or that ended without a last poll) leaves its
    /// HTTP/1.1 connection parked; one dropped part-way closes it, as HTTP/1.1 requires (an
    /// HTTP/2 stream dropped part-way is reset, its connection kept).
    fn drop(&mut self) {
        if self.incoming.is_end_stream() {
            self.park(&mut Context::from_waker(std::task::Waker::noop()));
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let incoming = &mut this.incoming;
        let frame = std::task::ready!(match &mut this.carrier {
            // Once it has closed, what it read is in `incoming`, and so is its error.
            Some(Carrier::Connection(conn)) => conn.poll_driven(cx, |cx| Pin::new(incoming).poll_frame(cx)),
            // A stream of a shared HTTP/2 connection, or parked at the body's end.
            Some(Carrier::Stream(_)) | None => Pin::new(incoming).poll_frame(cx),
        });
        if frame.is_none() {
            this.park(cx);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
