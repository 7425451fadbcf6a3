//! The accept loop every llmslo HTTP server shares: HTTP/1.1 and h2c on one port, header
//! limits, and a graceful drain on shutdown.

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How long a client may take to send a complete request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head accepted (HTTP/1.1 buffer and HTTP/2 header list).
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Serves `handler` on `listener` until `shutdown` fires, then lets open connections
/// finish for up to `drain` before returning.
pub async fn serve<F, Fut, B>(listener: TcpListener, handler: F, shutdown: CancellationToken, drain: Duration)
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_with(listener, |stream| async move { Ok(stream) }, handler, shutdown, drain).await
}

/// [`serve`] with each accepted connection first passed through `wrap` (a TLS handshake),
/// in the connection's own task so a slow handshake never holds up accepting.
pub async fn serve_with<W, WF, IO, F, Fut, B>(
    listener: TcpListener,
    wrap: W,
    handler: F,
    shutdown: CancellationToken,
    drain: Duration,
) where
    W: Fn(TcpStream) -> WF + Clone + Send + Sync + 'static,
    WF: Future<Output = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (handler, wrap, builder, watcher) = (handler.clone(), wrap.clone(), builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            let io = match wrap(stream).await {
                Ok(io) => io,
                Err(error) => {
                    debug!(%peer, %error, "connection set-up failed");
                    return;
                }
            };
            let service = service_fn(move |request| handler(request, peer));
            let connection = builder.serve_connection(TokioIo::new(io), service);
            if let Err(error) = watcher.watch(connection).await {
                debug!(%peer, error = %error, "connection closed with an error");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => info!("all connections drained"),
        _ = tokio::time::sleep(drain) => warn!(drain_secs = drain.as_secs_f64(), "drain deadline passed, closing remaining connections"),
    }
}
