//! The body vocabulary every layer shares: the error a body fails with, the boxed body that
//! requests and responses travel in, and the error an engine's silence ends a body with.

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
