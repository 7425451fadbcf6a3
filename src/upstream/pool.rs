//! The engine's HTTP/1.1 connections. A request drives the connection it holds from its own
//! task (the one serving the client): the engine's bytes are read, parsed and written on to
//! the client in one wake-up, with no hand-off between tasks. Between requests a connection is
//! parked here, unpolled, and checked for life when it is taken again.

use super::tls::EngineTls;
use super::wake::ConnWaker;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, Connection, SendRequest};
use hyper::Response;
use hyper_util::rt::TokioIo;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tracing::{debug, warn};

/// A boxed error, the error type of bodies that can fail in more than one way.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Body type sent to the upstream.
pub type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

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

/// Why no response came.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The engine could not be connected to.
    #[error("cannot connect to the upstream")]
    Connect(#[source] std::io::Error),
    /// The connection failed during the exchange.
    #[error("the upstream request failed")]
    Request(#[source] hyper::Error),
}

impl SendError {
    /// Whether the engine could not be connected to at all.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
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
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
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
    /// drive on and park again at its end. A parked connection that closed before taking the
    /// request is replaced by another; one the engine closed before answering (its keep-alive
    /// racing the request: the engine never read it) has the request sent once more on a new
    /// connection, when its body can be sent again (none, or [`Replayable`]).
    pub async fn send(
        &self,
        mut request: hyper::Request<UpstreamBody>,
    ) -> Result<(Response<Incoming>, Conn), SendError> {
        let mut replayed = false;
        loop {
            let parked = if replayed { None } else { self.take() };
            let (mut conn, reused) = match parked {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            let mut replay = reused.then(|| replay_of(&request)).flatten();
            let mut sent = std::pin::pin!(conn.sender.try_send_request(request));
            let answer = poll_fn(|cx| conn.poll_driven(cx, |cx| sent.as_mut().poll(cx))).await;
            match answer {
                Ok(response) => return Ok((response, conn)),
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

    /// Opens a new connection (and its TLS session, within the same timeout); a handshake that
    /// fails (an engine whose certificate does not verify) is a connect error.
    async fn connect(&self) -> Result<Conn, SendError> {
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
        let (sender, driver) = Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Request)?;
        Ok(Conn {
            sender,
            driver: Driver {
                future: Box::pin(driver),
                closed: false,
            },
            waker: ConnWaker::new(),
        })
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

    /// Closes the connections parked longer than the idle timeout.
    fn close_expired_now(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.retain(|parked| parked.since.elapsed() < self.idle_timeout);
    }

    /// How many connections are parked.
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A request body's bytes, kept beside it (in the request's extensions) so that the request can
/// be sent again when the engine closed its connection before reading it.
#[derive(Debug, Clone)]
pub struct Replayable(pub Bytes);

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
