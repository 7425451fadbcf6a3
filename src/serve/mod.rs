//! The accept loop every llmslo HTTP server shares: HTTP/1.1 and h2c on one port, header
//! limits, a connection cap, and the deadlines that free what a client holds without making
//! progress: the first complete request, the client taking each response frame (the send
//! timeout), an idle connection of either protocol, HTTP/2 keep-alive pings; then a graceful
//! drain on shutdown.

mod activity;
pub mod send_deadline;
pub mod tls;
mod until;

use crate::metrics::limits::LimitCounters;
use crate::metrics::{ClientTimeout, RefusalReason};
use crate::own_wake::{OnOwnWake, OnOwnWakeBody};
use crate::upstream::BoxError;
use activity::{Activity, Done};
use futures_util::FutureExt;
use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use send_deadline::{SendDeadlineBody, Watchdog};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};
use until::until;

/// Defaults of the accept loop's settings (the config keys of the same names).
pub mod defaults {
    use std::time::Duration;

    /// `send_timeout`.
    pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);
    /// `connection_idle_timeout`: as an HTTP/1.1 keep-alive connection waits for its next head.
    pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// `http2_keep_alive_interval`.
    pub const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
    /// `http2_keep_alive_timeout`.
    pub const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
    /// `max_connections`.
    pub const MAX_CONNECTIONS: usize = 2048;
    /// `max_streams_per_connection`.
    pub const MAX_STREAMS_PER_CONNECTION: u32 = 100;
    /// `drain_timeout`.
    pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
}

/// How long a client may take to send a complete request head (the first one counted from
/// the connection's accept, whatever the protocol: HTTP/1.1, the h2c preface and SETTINGS,
/// a TLS handshake).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the first bytes are looked at again while they cannot tell the protocol yet.
const SNIFF_POLL: Duration = Duration::from_millis(10);
/// Largest request head accepted (HTTP/1.1 buffer and HTTP/2 header list).
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// How long the answer to a connection over the cap may take (its request line read, where
/// one is looked at, and the answer written).
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections over the cap being answered at once; more are closed without an answer.
const MAX_REFUSALS_AT_ONCE: usize = 64;
/// The answer to a liveness probe on a connection over the cap.
const LIVE: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 3\r\n\r\nok\n";
/// The JSON body a connection over the cap is answered with before it is closed.
const OVER_CAPACITY_BODY: &str =
    r#"{"error":{"message":"llmslo is over its max_connections limit; retry in 1 s","type":"overloaded","code":503}}"#;

/// How many connections a server holds at once, and where it reports them.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Counts open and refused connections (the proxy port's).
    pub counters: Option<LimitCounters>,
    /// Longest a write may wait for the client to read, and longest a response frame may wait
    /// for the client to take it (an HTTP/2 window kept shut): the connection is closed, or the
    /// stream reset, beyond it.
    pub send_timeout: Option<Duration>,
    /// A connection with no request open for this long is closed (HTTP/2 with a GOAWAY).
    pub idle_timeout: Option<Duration>,
    /// HTTP/2 keep-alive: a PING after this much silence from the client, and the connection
    /// closed when its answer takes longer than the timeout.
    pub keep_alive: Option<KeepAlive>,
    /// Concurrent streams one HTTP/2 connection may open (advertised in its SETTINGS; hyper
    /// refuses the streams beyond it with REFUSED_STREAM, which clients retry).
    pub max_streams_per_connection: u32,
    /// Answer `GET /healthz` (HTTP/1.1) with 200 even on a connection over the cap: a full
    /// port must not read as a dead process to a liveness probe (the metrics port).
    pub live_when_full: bool,
}

impl ConnectionLimits {
    /// A cap of `max_connections`, reported nowhere, with no send timeout and the default
    /// streams per HTTP/2 connection.
    pub fn new(max_connections: usize) -> Self {
        Self {
            max_connections,
            counters: None,
            send_timeout: None,
            idle_timeout: None,
            keep_alive: None,
            max_streams_per_connection: defaults::MAX_STREAMS_PER_CONNECTION,
            live_when_full: false,
        }
    }
}

/// HTTP/2 keep-alive pings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAlive {
    /// Silence from the client after which a PING is sent.
    pub interval: Duration,
    /// How long its acknowledgement may take before the connection is closed.
    pub timeout: Duration,
}

/// Serves `handler` on `listener` until `shutdown` fires, then lets open connections
/// finish for up to `drain` before returning.
pub async fn serve<F, Fut, B>(
    listener: TcpListener,
    handler: F,
    shutdown: CancellationToken,
    drain: Duration,
    limits: ConnectionLimits,
) where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    serve_with(
        listener,
        |stream| async move { Ok(stream) },
        handler,
        shutdown,
        drain,
        limits,
    )
    .await
}

/// [`serve`], in TLS when `tls` is given: each connection's handshake runs in its own task,
/// under the head timeout, with the certificate in force when it was accepted.
pub async fn serve_on<F, Fut, B>(
    listener: TcpListener,
    tls: Option<Arc<tls::ServerTls>>,
    handler: F,
    shutdown: CancellationToken,
    drain: Duration,
    limits: ConnectionLimits,
) where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    match tls {
        None => serve(listener, handler, shutdown, drain, limits).await,
        Some(tls) => {
            let handshake = move |stream| {
                let acceptor = tls.acceptor();
                async move { acceptor.accept(stream).await }
            };
            serve_with(listener, handshake, handler, shutdown, drain, limits).await
        }
    }
}

/// [`serve`] with each accepted connection first passed through `wrap` (a TLS handshake),
/// in the connection's own task so a slow handshake never holds up accepting.
///
/// A connection must send a complete first request within the head timeout of its accept
/// (its first bytes, `wrap`, the protocol's preface and the request head); a connection over
/// the cap is answered 503 and closed at once.
pub async fn serve_with<W, WF, IO, F, Fut, B>(
    listener: TcpListener,
    wrap: W,
    handler: F,
    shutdown: CancellationToken,
    drain: Duration,
    limits: ConnectionLimits,
) where
    W: Fn(TcpStream) -> WF + Clone + Send + Sync + 'static,
    WF: Future<Output = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // Shared, not cloned: a connection's task holds one pointer to them, not 472 bytes.
    let builders = Arc::new(Builders::new(limits.max_streams_per_connection, limits.keep_alive));
    let connections = TaskTracker::new();
    // One task watches every response's send deadline.
    let watchdog = limits
        .send_timeout
        .map(|timeout| Watchdog::<B>::start(timeout, limits.counters.clone()));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_AT_ONCE));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse_over_capacity(stream, peer, &limits, &refusals);
            continue;
        };
        let open = limits.counters.as_ref().map(|m| m.connection_opened());
        let (handler, wrap, builders) = (handler.clone(), wrap.clone(), builders.clone());
        let (limits, shutdown, watchdog) = (limits.clone(), shutdown.clone(), watchdog.clone());
        let deadline = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
        let task = async move {
            let _held = (slot, open);
            // A connection that has sent nothing yet (a client's spare, opened ahead of need)
            // holds up no drain: it is closed as the stop begins.
            let sniffed = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    debug!(%peer, "connection closed: stopping, and it had sent nothing");
                    return;
                }
                sniffed = tokio::time::timeout_at(deadline, first_bytes_then(stream, wrap)) => sniffed,
            };
            let (io, protocol) = match sniffed {
                Ok(Ok(sniffed)) => sniffed,
                Ok(Err(error)) => {
                    debug!(%peer, %error, "connection set-up failed");
                    return;
                }
                Err(_) => {
                    debug!(%peer, "connection closed: nothing sent within the head timeout");
                    return;
                }
            };
            let requested = Arc::new(Notify::new());
            let activity = Activity::new();
            let service = {
                let (first, activity, watchdog) = (requested.clone(), activity.clone(), watchdog.clone());
                service_fn(move |request| {
                    first.notify_one();
                    let open = activity.open();
                    let watchdog = watchdog.clone();
                    // Mapped, not awaited in an async block, which would hold the handler's
                    // future twice (hyper keeps room for it for the connection's life).
                    handler(request, peer).map(move |answered| {
                        Ok::<_, Infallible>(answered?.map(|body| {
                            // hyper asks a waiting body twice per wake-up; one ask goes through.
                            // The watchdog lets a body go only after it gave a frame, when the
                            // next ask goes through anyway.
                            OnOwnWakeBody::new(match &watchdog {
                                Some(watchdog) => watchdog.watch(body, open),
                                None => SendDeadlineBody::unwatched(body, open),
                            })
                        }))
                    })
                })
            };
            // A client that stops reading fails the next write after the send timeout: the
            // connection closes, and the engine's request with it.
            let mut io = tokio_io_timeout::TimeoutStream::new(io);
            io.set_write_timeout(limits.send_timeout);
            let io = TokioIo::new(Box::pin(io));
            // Shutdown lets the connection finish for the drain (and the moment the accept loop
            // takes to mark what is cut at its deadline); idleness gives it a moment.
            let stop = async {
                tokio::select! {
                    _ = shutdown.cancelled() => drain + CUT_MARK_LEAD,
                    done = finished(&activity, limits.idle_timeout) => {
                        match done {
                            Done::Idle => {
                                debug!(%peer, "connection closed: idle for the idle timeout");
                                if let Some(counters) = &limits.counters {
                                    counters.count_client_timeout(ClientTimeout::ConnectionIdle);
                                }
                            }
                            Done::Stalled => debug!(%peer, "connection closed: its client took nothing of its responses"),
                        }
                        IDLE_CLOSE_GRACE
                    }
                }
            };
            // Boxed one by one: a connection holds only its own protocol's state.
            let connection: Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> = match protocol {
                Some(Protocol::Http1) => Box::pin(until(builders.http1.serve_connection(io, service), stop)),
                Some(Protocol::H2c) => Box::pin(until(builders.h2c.serve_connection(io, service), stop)),
                None => Box::pin(until(builders.sniffing.serve_connection(io, service), stop)),
            };
            let served = tokio::select! {
                biased;
                served = connection => served,
                _ = OnOwnWake::new(no_request_by(deadline, &requested)) => {
                    debug!(%peer, "connection closed: no complete request within the head timeout");
                    return;
                }
            };
            if let Err(error) = served {
                debug!(%peer, error = %error, "connection closed with an error");
            }
        };
        connections.spawn(task);
    }
    drop(listener);
    connections.close();
    tokio::select! {
        _ = connections.wait() => debug!("all connections drained"),
        _ = tokio::time::sleep(drain) => {
            warn!(
                drain_secs = drain.as_secs_f64(),
                connections = connections.len(),
                "drain deadline passed, closing remaining connections: their open responses are recorded as cut (outcome shutdown)"
            );
            // Each connection drops itself just after this; every response it drops is
            // recorded before the loop returns, so the final scrape that follows counts it.
            if let Some(counters) = &limits.counters {
                counters.cut_at_shutdown();
            }
            if tokio::time::timeout(CUT_MARK_LEAD + CUT_WAIT, connections.wait()).await.is_err() {
                warn!(connections = connections.len(), "connections still open after the drain deadline");
            }
        }
    }
}

/// How much longer than the drain a connection runs once the stop began, so that the accept
/// loop marks the responses it drops as cut before it drops them.
const CUT_MARK_LEAD: Duration = Duration::from_millis(100);
/// How long the accept loop waits past that for the cut connections to be dropped.
const CUT_WAIT: Duration = Duration::from_secs(2);

/// How long an idle or stalled connection's close may take (its GOAWAY, and any stream still
/// parked behind a shut window) before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Completes once the connection is done with: no request open for `timeout`, or its last
/// requests let go at their send deadline; never idle without a timeout.
async fn finished(activity: &Activity, timeout: Option<Duration>) -> Done {
    /// Idle for ever, in effect: far enough, and near enough for a clock to add it.
    const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    activity.done(timeout.unwrap_or(NEVER)).await
}

/// How each connection is served, once its first bytes tell the protocol or do not.
struct Builders {
    http1: http1::Builder,
    h2c: http2::Builder<TokioExecutor>,
    /// hyper-util's version sniff, for a TLS stream or a client that sent too few bytes to
    /// tell. It has no request-head limit of its own: a head that arrives in few reads can
    /// pass `max_buf_size`.
    sniffing: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(max_streams: u32, keep_alive: Option<KeepAlive>) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(MAX_HEADER_BYTES)
            .max_header_size(MAX_HEADER_BYTES);
        let mut h2c = http2::Builder::new(TokioExecutor::new());
        h2c.timer(TokioTimer::new())
            .max_concurrent_streams(max_streams)
            .max_header_list_size(MAX_HEADER_BYTES as u32);
        if let Some(keep_alive) = keep_alive {
            h2c.keep_alive_interval(keep_alive.interval)
                .keep_alive_timeout(keep_alive.timeout);
        }
        let mut sniffing = auto::Builder::new(TokioExecutor::new());
        sniffing
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(MAX_HEADER_BYTES);
        sniffing
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(max_streams)
            .max_header_list_size(MAX_HEADER_BYTES as u32);
        if let Some(keep_alive) = keep_alive {
            sniffing
                .http2()
                .keep_alive_interval(keep_alive.interval)
                .keep_alive_timeout(keep_alive.timeout);
        }
        Self { http1, h2c, sniffing }
    }
}

/// Completes once `deadline` passes before the connection's first request arrived (never
/// after it arrived).
async fn no_request_by(deadline: tokio::time::Instant, requested: &Notify) {
    tokio::select! {
        _ = requested.notified() => std::future::pending().await,
        _ = tokio::time::sleep_until(deadline) => {}
    }
}

/// Waits for the client's first bytes (or its EOF), and for more while they are a part of the
/// h2c preface too short to tell; then sets the connection up with `wrap` and says which
/// protocol the bytes begin, when they are plain HTTP.
async fn first_bytes_then<W, WF, IO>(stream: TcpStream, wrap: W) -> std::io::Result<(IO, Option<Protocol>)>
where
    W: Fn(TcpStream) -> WF,
    WF: Future<Output = std::io::Result<IO>>,
{
    let mut first = [0u8; H2C_PREFACE.len()];
    let mut seen = 0;
    loop {
        let n = stream.peek(&mut first).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before sending anything",
            ));
        }
        let undecided =
            n < first.len() && H2C_PREFACE.starts_with(&first[..n]) && Protocol::of_first_bytes(&first[..n]).is_none();
        if !undecided {
            return Ok((wrap(stream).await?, Protocol::of_first_bytes(&first[..n])));
        }
        // A peek sees the same bytes until more arrive: look again a little later, unless
        // the client has closed (a peek never shows the end while bytes are unread).
        if n == seen {
            tokio::time::sleep(SNIFF_POLL).await;
            if peer_closed(&stream).await {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed part-way through the h2c preface",
                ));
            }
        }
        seen = n;
    }
}

/// Whether the peer has closed its side, as the socket's readiness already knows it (looked at
/// once, never waited for).
async fn peer_closed(stream: &TcpStream) -> bool {
    let ready = stream.ready(Interest::READABLE);
    tokio::pin!(ready);
    std::future::poll_fn(|cx| match ready.as_mut().poll(cx) {
        std::task::Poll::Ready(Ok(ready)) => std::task::Poll::Ready(ready.is_read_closed()),
        _ => std::task::Poll::Ready(false),
    })
    .await
}

/// What every HTTP/2 connection without TLS (h2c with prior knowledge) begins with.
const H2C_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a plain-text connection speaks, told from its first bytes before hyper reads
/// them. Told here, the connection gets its protocol's own server: HTTP/1.1 then enforces the
/// request-head limit however the head arrives, and its read buffer stays at 8 KiB (hyper-util's
/// sniff hands HTTP/1 the first bytes alone, and the buffer doubles to 16 KiB on every
/// connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// A request line: a method in capitals.
    Http1,
    /// The HTTP/2 connection preface.
    H2c,
}

impl Protocol {
    /// `None` when the bytes do not tell: a TLS handshake (the protocol comes after it), or
    /// too few bytes of what may be the preface; hyper-util then sniffs as before.
    fn of_first_bytes(first: &[u8]) -> Option<Protocol> {
        let preface_so_far = H2C_PREFACE.starts_with(first);
        match first.first()? {
            _ if preface_so_far => (first.len() >= b"PRI ".len()).then_some(Protocol::H2c),
            b'A'..=b'Z' => Some(Protocol::Http1),
            _ => None,
        }
    }
}

/// Answers a connection over the cap with a 503 and closes it, off the accept loop; where
/// the port stays live when full, a `GET /healthz` gets its 200 instead.
fn refuse_over_capacity(stream: TcpStream, peer: SocketAddr, limits: &ConnectionLimits, refusals: &Arc<Semaphore>) {
    if let Some(counters) = &limits.counters {
        counters.count_refused(RefusalReason::ConnectionLimit);
    }
    debug!(%peer, max_connections = limits.max_connections, "connection refused: at the connection cap");
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return; // a flood of them: closed unanswered
    };
    let live_when_full = limits.live_when_full;
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(REFUSAL_TIMEOUT, answer_refused(stream, live_when_full)).await;
    });
}

/// Writes the refusal, or the liveness answer to a probe when `live_when_full`.
async fn answer_refused(mut stream: TcpStream, live_when_full: bool) -> std::io::Result<()> {
    if live_when_full && asks_for_liveness(&stream).await? {
        stream.write_all(LIVE).await?;
        return stream.shutdown().await;
    }
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{OVER_CAPACITY_BODY}",
        OVER_CAPACITY_BODY.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Whether the connection's first bytes are `GET /healthz` (waiting for them to arrive).
async fn asks_for_liveness(stream: &TcpStream) -> std::io::Result<bool> {
    const PROBE: &[u8] = b"GET /healthz ";
    let mut first = [0u8; PROBE.len()];
    loop {
        let n = stream.peek(&mut first).await?;
        if n == 0 || !PROBE.starts_with(&first[..n]) {
            return Ok(false);
        }
        if n == PROBE.len() {
            return Ok(true);
        }
        tokio::time::sleep(SNIFF_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_tell_plain_http1_from_h2c() {
        assert_eq!(
            Protocol::of_first_bytes(b"POST /v1/chat/completions HTTP/1.1\r\n"),
            Some(Protocol::Http1)
        );
        assert_eq!(Protocol::of_first_bytes(b"G"), Some(Protocol::Http1));
        assert_eq!(Protocol::of_first_bytes(b"PRI / HTTP/1.1\r\n"), Some(Protocol::Http1));
        assert_eq!(Protocol::of_first_bytes(H2C_PREFACE), Some(Protocol::H2c));
        assert_eq!(Protocol::of_first_bytes(b"PRI *"), Some(Protocol::H2c));
    }

    #[test]
    fn what_the_first_bytes_do_not_tell_is_left_to_hyper() {
        // Maybe the preface, maybe POST or PUT: too few bytes.
        assert_eq!(Protocol::of_first_bytes(b"P"), None);
        assert_eq!(Protocol::of_first_bytes(b"PR"), None);
        // A TLS ClientHello: the protocol comes after the handshake.
        assert_eq!(Protocol::of_first_bytes(&[0x16, 0x03, 0x01, 0x02, 0x00]), None);
        assert_eq!(Protocol::of_first_bytes(b"get / HTTP/1.1\r\n"), None);
    }
}
