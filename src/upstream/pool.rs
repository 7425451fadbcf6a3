//! The engine's connections. A request on HTTP/1.1 drives the connection it holds from its own
//! task (the one serving the client): the engine's bytes are read, parsed and written on to
//! the client in one wake-up, with no hand-off between tasks. Between requests a connection is
//! parked here, unpolled, and checked for life when it is taken again. An https engine whose
//! ALPN chooses h2 gets shared HTTP/2 connections instead (a hundred streams each), driven by
//! tasks of their own, each request a stream on one.

use super::tls::EngineTls;
use super::wake::ConnWaker;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, Connection, SendRequest};
use hyper::client::conn::http2;
use hyper::Response;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, warn};

pub use crate::body::{BoxError, Replayable, SendError};
/// Body type sent to the upstream.
pub type UpstreamBody = crate::body::BoxBody;

/// The most of the engine's bytes one HTTP/2 stream holds here unread (its flow-control
/// window, a dozen stream events or more): a client that stops reading holds no more than this
/// of a shared connection, and the connection's window is this for every request that can be
/// in flight, so no stalled streams can starve the others.
pub const H2_STREAM_WINDOW: u32 = 4 << 10;

/// A connection to the engine: plain, or in TLS.
type EngineIo = tokio_util::either::Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// A connection's driver: the future that reads and writes its socket, until it completes.
struct Driver {
    future: Pin<Box<Connection<TokioIo<EngineIo>, UpstreamBody>>>,
    /// The future has completed: the connection is closed, and is never polled again.
    closed: bool,
}

impl Driver {
    /// Moves the connection's bytes; `true` once it has closed (or failed).
    fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.closed {
            self.closed = self.future.as_mut().poll(cx).is_ready();
        }
        self.closed
    }
}

/// One connection to the engine: where requests go in, and the future that moves its bytes.
pub struct Conn {
    sender: SendRequest<UpstreamBody>,
    driver: Driver,
    /// What the driver, and what waits on it, are polled with.
    waker: ConnWaker,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").finish_non_exhaustive()
    }
}

impl Conn {
    /// Moves the connection's bytes and polls `waiting` (a response, its body) after them, both
    /// with the connection's own waker: the wake-ups they give each other during the poll do
    /// not have the task polled again (see [`ConnWaker`]).
    pub fn poll_driven<T>(
        &mut self,
        cx: &mut Context<'_>,
        waiting: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        let mut own = Context::from_waker(self.waker.enter(cx.waker()));
        self.driver.poll(&mut own);
        let polled = waiting(&mut own);
        self.waker.leave(polled.is_pending());
        polled
    }

    /// Open, and ready for its next request: polled once, it neither closed nor is busy.
    fn alive(&mut self) -> bool {
        !self.driver.poll(&mut Context::from_waker(Waker::noop())) && self.sender.is_ready()
    }
}

/// The idle connections to one engine and how to open more.
#[derive(Debug)]
pub struct Pool {
    address: String,
    /// The TLS connections are wrapped in, for an https engine.
    tls: Option<EngineTls>,
    /// When a failed TLS handshake was last logged (at most one line a minute).
    tls_failure_logged: Mutex<Option<Instant>>,
    idle: Mutex<Vec<Parked>>,
    /// The engine's HTTP/2 connections, once its ALPN chose h2: each request is a stream on
    /// one with a stream to spare.
    shared: Mutex<Vec<Shared>>,
    /// A request is opening a TLS connection that may turn out HTTP/2: the others wait for it
    /// rather than each open one of their own.
    opening: AtomicBool,
    /// Woken when that opening ends, whatever came of it.
    opened: Notify,
    /// The last opening failed (or its request went away): the waiting requests open their own.
    opening_failed: AtomicBool,
    /// The engine's ALPN chose HTTP/1.1: requests open connections without waiting for others.
    serves_http1: AtomicBool,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
}

/// How many streams at once one HTTP/2 connection carries before another is opened: the least
/// that HTTP/2 asks servers to allow, so that no request waits on the engine's limit.
const H2_STREAMS_PER_CONNECTION: usize = 100;

/// A shared HTTP/2 connection, the streams it carries, and when a request last took it.
#[derive(Debug)]
struct Shared {
    sender: http2::SendRequest<UpstreamBody>,
    streams: Arc<AtomicUsize>,
    used: Instant,
}

/// A stream's place on a shared HTTP/2 connection, given back when it is dropped.
#[derive(Debug)]
pub struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a response arrives on: an HTTP/1.1 connection of its own, or a stream of a shared
/// HTTP/2 connection.
#[derive(Debug)]
pub enum Carrier {
    /// Driven by the body's reader, and parked at its end.
    Connection(Conn),
    /// Driven by the connection's own task; the place is given back at the body's end.
    Stream(StreamSlot),
}

/// A connection for a request: an HTTP/1.1 one of its own, or a place on a shared HTTP/2 one.
enum Opened {
    Http1(Conn),
    Http2(http2::SendRequest<UpstreamBody>, StreamSlot),
}

/// A connection between requests, since when.
#[derive(Debug)]
struct Parked {
    conn: Conn,
    since: Instant,
}

impl Pool {
    /// A pool for `address` (`host:port`, in `tls` when given) that keeps at most `max_idle`
    /// connections for at most `idle_timeout` each. Within a runtime, a task closes the
    /// expired ones.
    pub fn new(
        address: String,
        tls: Option<EngineTls>,
        max_idle: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            address,
            tls,
            tls_failure_logged: Mutex::default(),
            idle: Mutex::default(),
            shared: Mutex::default(),
            opening: AtomicBool::new(false),
            opened: Notify::new(),
            opening_failed: AtomicBool::new(false),
            serves_http1: AtomicBool::new(false),
            max_idle,
            idle_timeout,
            connect_timeout,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close_expired(Arc::downgrade(&pool), idle_timeout));
        }
        pool
    }

    /// Sends `request` on a parked connection, or a new one, and drives it from this task
    /// until the response head: the response comes with its connection, for its body to
    /// drive on and park again at its end, or with its place on a shared HTTP/2 connection
    /// (which drives itself). A parked connection that closed before taking the request is
    /// replaced by another; one the engine closed before answering (its keep-alive racing the
    /// request: the engine never read it) has the request sent once more on a new connection,
    /// when its body can be sent again (none, or [`Replayable`]).
    pub async fn send(
        &self,
        mut request: hyper::Request<UpstreamBody>,
    ) -> Result<(Response<Incoming>, Carrier), SendError> {
        if let Some((sender, slot)) = self.take_shared() {
            match self.send_h2(sender, request).await? {
                Ok(response) => return Ok((response, Carrier::Stream(slot))),
                // The engine closed the connection before the stream opened: another one.
                Err(unsent) => request = unsent,
            }
        }
        let mut replayed = false;
        loop {
            let parked = if replayed { None } else { self.take() };
            let (mut conn, reused) = match parked {
                Some(conn) => (conn, true),
                None => match self.open().await? {
                    Opened::Http1(conn) => (conn, false),
                    Opened::Http2(sender, slot) => {
                        return match self.send_h2(sender, request).await? {
                            Ok(response) => Ok((response, Carrier::Stream(slot))),
                            Err(_) => Err(SendError::ClosedBeforeUse),
                        };
                    }
                },
            };
            let mut replay = reused.then(|| replay_of(&request)).flatten();
            let mut sent = std::pin::pin!(conn.sender.try_send_request(request));
            let answer = poll_fn(|cx| conn.poll_driven(cx, |cx| sent.as_mut().poll(cx))).await;
            match answer {
                Ok(response) => return Ok((response, Carrier::Connection(conn))),
                Err(mut error) => match error.take_message() {
                    Some(unsent) if reused => request = unsent,
                    _ => match replay.take().filter(|_| closed_before_answering(error.error())) {
                        Some(again) => {
                            debug!("the engine closed a reused connection before answering: sent again on a new one");
                            request = again;
                            replayed = true;
                        }
                        None => return Err(SendError::Request(error.into_error())),
                    },
                },
            }
        }
    }

    /// A connection for a request that found none to take: a new one, or a place on a shared
    /// HTTP/2 connection another request opened meanwhile. While the engine's protocol is not
    /// known to be HTTP/1.1, one request at a time opens a TLS connection and the others wait
    /// for it (a burst at start opens an HTTP/2 connection per hundred streams, not one each);
    /// when that opening fails, they each open their own.
    async fn open(&self) -> Result<Opened, SendError> {
        loop {
            if self.tls.is_none() || self.serves_http1.load(Ordering::Acquire) {
                return self.connect().await;
            }
            if let Some((sender, slot)) = self.take_shared() {
                return Ok(Opened::Http2(sender, slot));
            }
            let mut ended = std::pin::pin!(self.opened.notified());
            ended.as_mut().enable();
            if self
                .opening
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let mut opening = Opening {
                    pool: self,
                    failed: true,
                };
                let opened = self.connect().await?;
                if matches!(opened, Opened::Http1(_)) {
                    self.serves_http1.store(true, Ordering::Release);
                }
                opening.failed = false;
                return Ok(opened);
            }
            ended.await;
            if self.opening_failed.load(Ordering::Acquire) {
                return self.connect().await;
            }
        }
    }

    /// Sends `request` as a stream of the HTTP/2 connection `sender` leads to; the request comes
    /// back unsent when the connection closed before it could open its stream.
    async fn send_h2(
        &self,
        mut sender: http2::SendRequest<UpstreamBody>,
        request: hyper::Request<UpstreamBody>,
    ) -> Result<Result<Response<Incoming>, hyper::Request<UpstreamBody>>, SendError> {
        let request = self.for_h2(request);
        if sender.ready().await.is_err() {
            return Ok(Err(request));
        }
        match sender.try_send_request(request).await {
            Ok(response) => Ok(Ok(response)),
            Err(mut error) => match error.take_message() {
                Some(unsent) => Ok(Err(unsent)),
                None => Err(SendError::Request(error.into_error())),
            },
        }
    }

    /// `request` as an HTTP/2 stream needs it: its target in full (`https`, and the authority
    /// its `Host` header named, else the engine's address), the `Host` header dropped for it.
    fn for_h2(&self, mut request: hyper::Request<UpstreamBody>) -> hyper::Request<UpstreamBody> {
        let authority = request
            .headers_mut()
            .remove(http::header::HOST)
            .and_then(|host| http::uri::Authority::try_from(host.as_bytes()).ok())
            .unwrap_or_else(|| {
                http::uri::Authority::try_from(self.address.as_str()).expect("the engine's address is an authority")
            });
        let mut parts = request.uri().clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTPS);
        parts.authority = Some(authority);
        if parts.path_and_query.is_none() {
            parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        }
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        *request.version_mut() = http::Version::HTTP_2;
        request
    }

    /// A place on a shared HTTP/2 connection that is open and has a stream to spare; the closed
    /// ones are let go.
    fn take_shared(&self) -> Option<(http2::SendRequest<UpstreamBody>, StreamSlot)> {
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.retain(|open| !open.sender.is_closed());
        let open = shared
            .iter_mut()
            .find(|open| open.streams.load(Ordering::Acquire) < H2_STREAMS_PER_CONNECTION)?;
        open.streams.fetch_add(1, Ordering::AcqRel);
        open.used = Instant::now();
        Some((open.sender.clone(), StreamSlot(open.streams.clone())))
    }

    /// Shares a new HTTP/2 connection, its first place taken.
    fn share(&self, sender: http2::SendRequest<UpstreamBody>) -> StreamSlot {
        let streams = Arc::new(AtomicUsize::new(1));
        self.shared.lock().unwrap_or_else(|e| e.into_inner()).push(Shared {
            sender,
            streams: streams.clone(),
            used: Instant::now(),
        });
        StreamSlot(streams)
    }

    /// The most recently parked connection that is still alive; the others are closed. Each
    /// is checked (a read of its socket) after the lock is let go.
    fn take(&self) -> Option<Conn> {
        loop {
            let mut parked = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
            if parked.since.elapsed() < self.idle_timeout && parked.conn.alive() {
                return Some(parked.conn);
            }
        }
    }

    /// Opens a new connection (and its TLS session, within the same timeout): HTTP/2 when the
    /// engine's ALPN chose it, else HTTP/1.1. A handshake that fails (an engine whose
    /// certificate does not verify) is a connect error.
    async fn connect(&self) -> Result<Opened, SendError> {
        let timed_out = || SendError::Connect(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"));
        let deadline = Instant::now() + self.connect_timeout;
        let stream = tokio::time::timeout_at(deadline, TcpStream::connect(&self.address))
            .await
            .map_err(|_| timed_out())?
            .map_err(SendError::Connect)?;
        stream.set_nodelay(true).map_err(SendError::Connect)?;
        let stream = match &self.tls {
            None => tokio_util::either::Either::Left(stream),
            Some(tls) => {
                let session = tokio::time::timeout_at(deadline, tls.connect(stream))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(|e| {
                        self.log_tls_failure(&e);
                        SendError::Connect(std::io::Error::new(
                            e.kind(),
                            format!("the TLS handshake with the engine failed: {e}"),
                        ))
                    })?;
                tokio_util::either::Either::Right(session)
            }
        };
        if is_h2(&stream) {
            let sender = self.handshake_h2(stream).await?;
            let slot = self.share(sender.clone());
            return Ok(Opened::Http2(sender, slot));
        }
        let (sender, driver) = Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Request)?;
        Ok(Opened::Http1(Conn {
            sender,
            driver: Driver {
                future: Box::pin(driver),
                closed: false,
            },
            waker: ConnWaker::new(),
        }))
    }

    /// Starts HTTP/2 on `stream`, its connection driven by a task of its own until every
    /// request's stream and every sender of it have gone.
    async fn handshake_h2(&self, stream: EngineIo) -> Result<http2::SendRequest<UpstreamBody>, SendError> {
        let connection_window = H2_STREAM_WINDOW
            .saturating_mul(self.max_idle.max(1) as u32)
            .min(MAX_H2_WINDOW);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(connection_window)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Request)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, "the engine's HTTP/2 connection ended");
            }
        });
        Ok(sender)
    }

    /// Says why the engine's TLS handshake failed, at most once a minute.
    fn log_tls_failure(&self, error: &std::io::Error) {
        let mut logged = self.tls_failure_logged.lock().unwrap_or_else(|e| e.into_inner());
        if logged.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
            return;
        }
        *logged = Some(Instant::now());
        warn!(
            %error,
            upstream = %self.address,
            "the TLS handshake with the engine failed: its requests are answered 502 (connect_error) until it \
             succeeds; name the engine's CA in upstream_tls.ca_file, or, for an engine on this host with a \
             certificate of its own, set upstream_tls.insecure_skip_verify"
        );
    }

    /// Parks a connection whose exchange ended, when it can take another request and there
    /// is room; else it closes.
    pub fn park(&self, mut conn: Conn, cx: &mut Context<'_>) {
        if conn.driver.poll(cx) || !conn.sender.is_ready() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < self.max_idle {
            idle.push(Parked {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Closes the connections parked longer than the idle timeout, and the shared ones that
    /// carry no stream and that no request took for as long.
    fn close_expired_now(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|parked| parked.since.elapsed() < self.idle_timeout);
        drop(idle);
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        shared.retain(|open| open.used.elapsed() < self.idle_timeout || open.streams.load(Ordering::Acquire) > 0);
    }

    /// How many HTTP/2 connections are kept for requests to share.
    #[cfg(test)]
    pub fn shared(&self) -> usize {
        self.shared.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// How many connections are parked.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A request's opening of a connection, which ends (the waiting requests woken) when it is
/// dropped: when the connection is open, has failed, or the request went away.
struct Opening<'a> {
    pool: &'a Pool,
    /// No connection came of it (yet).
    failed: bool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.pool.opening_failed.store(self.failed, Ordering::Release);
        self.pool.opening.store(false, Ordering::Release);
        self.pool.opened.notify_waiters();
    }
}

/// The largest flow-control window HTTP/2 allows.
const MAX_H2_WINDOW: u32 = (1 << 31) - 1;

/// Whether the engine's ALPN chose h2 for `stream`.
fn is_h2(stream: &EngineIo) -> bool {
    match stream {
        tokio_util::either::Either::Left(_) => false,
        tokio_util::either::Either::Right(tls) => tls.get_ref().1.alpn_protocol() == Some(b"h2"),
    }
}

/// The same request again, when its body can be sent again: it has none, or is [`Replayable`].
fn replay_of(request: &hyper::Request<UpstreamBody>) -> Option<hyper::Request<UpstreamBody>> {
    let body = if request.body().is_end_stream() {
        Bytes::new()
    } else {
        request.extensions().get::<Replayable>()?.0.clone()
    };
    let mut again = hyper::Request::new(Full::new(body).map_err(|never| match never {}).boxed_unsync());
    *again.method_mut() = request.method().clone();
    *again.uri_mut() = request.uri().clone();
    *again.version_mut() = request.version();
    *again.headers_mut() = request.headers().clone();
    Some(again)
}

/// Whether the exchange failed because the engine closed the connection before any answer:
/// the connection ended (closed, reset, or a broken pipe on the write) with no response head.
fn closed_before_answering(error: &hyper::Error) -> bool {
    use std::io::ErrorKind;
    if error.is_incomplete_message() {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
            );
        }
        cause = error.source();
    }
    false
}

/// Every `period`, closes the expired connections of the pool, while it exists.
async fn close_expired(pool: Weak<Pool>, period: Duration) {
    let mut tick = tokio::time::interval(period.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        match pool.upgrade() {
            Some(pool) => pool.close_expired_now(),
            None => return,
        }
    }
}
