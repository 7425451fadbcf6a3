//! The body vocabulary every layer shares: the error a body fails with, the boxed body that
//! requests and responses travel in, the error an engine's silence ends a body with, and
//! what passes between the observer and the client that sends to the engine (a body kept for
//! a resend, why no response came).

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use std::time::Duration;

/// A boxed error, the error type of bodies that can fail in more than one way.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed body: what is sent to the engine and what the proxy answers with.
pub type BoxBody = UnsyncBoxBody<Bytes, BoxError>;

/// The engine sent nothing on an open response body for `stream_idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing for {}", humantime::format_duration(*.0))]
pub struct StreamIdle(pub Duration);

/// Why no response came.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The engine could not be connected to.
    #[error("cannot connect to the upstream")]
    Connect(#[source] std::io::Error),
    /// The connection failed during the exchange.
    #[error("the upstream request failed")]
    Request(#[source] hyper::Error),
    /// A new HTTP/2 connection closed before the request's stream could open.
    #[error("the upstream closed a new HTTP/2 connection before taking the request")]
    ClosedBeforeUse,
}

impl SendError {
    /// Whether the engine could not be connected to at all.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }
}

/// A request body's bytes, kept beside it (in the request's extensions) so that the request can
/// be sent again when the engine closed its connection before reading it.
#[derive(Debug, Clone)]
pub struct Replayable(pub Bytes);
