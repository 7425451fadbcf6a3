//! Errors the proxy answers itself, each with a status and a JSON body in the OpenAI shape.

use super::request_body::ClientFault;
use super::ProxyBody;
use crate::metrics::RefusalReason;
use crate::record::Outcome;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::time::Duration;
use tracing::debug;

/// Seconds a client the sidecar refused for its own limits is asked to wait before retrying.
pub const RETRY_AFTER_SECS: u32 = 1;

/// A failure the sidecar reports to the client instead of an engine response.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The engine could not be reached or refused the connection, or failed the exchange.
    #[error("the engine is unavailable: {reason}")]
    Unavailable {
        /// The configured upstream.
        upstream: String,
        /// Why, without request content.
        reason: String,
        /// No connection to it could be made.
        connect: bool,
    },
    /// The engine sent no response head in time.
    #[error("the engine sent no response within {}", humantime::format_duration(*.after))]
    Timeout {
        /// The configured upstream.
        upstream: String,
        /// The configured response-head timeout.
        after: Duration,
    },
    /// The engine answered something a proxy cannot pass on.
    #[error("the engine answered {what}")]
    BadUpstreamResponse {
        /// The configured upstream.
        upstream: String,
        /// What it answered, without request content.
        what: &'static str,
    },
    /// The client's request body could not be read, or is over a limit.
    #[error("{0}")]
    Client(ClientFault),
    /// The sidecar refused the request to protect itself (a limit on buffered bytes, requests
    /// in flight, its own file descriptors); the client may retry after [`RETRY_AFTER_SECS`].
    #[error("llmslo is over its {} limit; retry in {RETRY_AFTER_SECS} s", .0.limit())]
    Overloaded(RefusalReason),
    /// CONNECT (tunnelling) is refused: llmslo is not an open proxy.
    #[error("CONNECT is not supported: llmslo forwards only to its configured upstream")]
    ConnectRefused,
}

impl ProxyError {
    /// How a measured request that ends in this error is counted.
    pub fn outcome(&self) -> Outcome {
        match self {
            ProxyError::Unavailable { connect: true, .. } => Outcome::ConnectError,
            ProxyError::Unavailable { .. } | ProxyError::BadUpstreamResponse { .. } => Outcome::UpstreamError,
            ProxyError::Timeout { .. } => Outcome::Timeout,
            ProxyError::Client(fault) => fault.outcome(),
            ProxyError::Overloaded(_) | ProxyError::ConnectRefused => Outcome::ClientError,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ProxyError::Unavailable { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BadUpstreamResponse { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Client(fault) => fault.status(),
            ProxyError::Overloaded(RefusalReason::ClientInFlightLimit) => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::ConnectRefused => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ProxyError::Unavailable { .. } => "upstream_unavailable",
            ProxyError::Timeout { .. } => "upstream_timeout",
            ProxyError::BadUpstreamResponse { .. } => "upstream_protocol_error",
            ProxyError::Client(ClientFault::TooLarge(_)) => "request_too_large",
            ProxyError::Client(ClientFault::TimedOut(_) | ClientFault::TooSlow(_)) => "request_timeout",
            ProxyError::Client(_) => "bad_request_body",
            ProxyError::Overloaded(_) => "overloaded",
            ProxyError::ConnectRefused => "method_not_allowed",
        }
    }

    /// The response sent to the client: `{"error":{"message":...,"type":...}}`. The message
    /// never names the engine's address (the sidecar's own log does, at debug level).
    pub fn into_response(self) -> Response<ProxyBody> {
        if let ProxyError::Unavailable { upstream, .. }
        | ProxyError::Timeout { upstream, .. }
        | ProxyError::BadUpstreamResponse { upstream, .. } = &self
        {
            debug!(upstream, error = %self, "answered the client for the engine");
        }
        let mut response = error_response(self.status(), self.kind(), &self.to_string());
        if let ProxyError::Overloaded(_) = &self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, RETRY_AFTER_SECS.into());
        }
        response
    }
}

/// An answer of the sidecar's own in the OpenAI error shape:
/// `{"error":{"message":...,"type":...,"code":...}}`.
pub fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<ProxyBody> {
    let body = serde_json::json!({"error": {"message": message, "type": kind, "code": status.as_u16()}});
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(body.to_string()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("static response parts are valid")
}
