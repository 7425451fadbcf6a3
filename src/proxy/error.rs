//! Errors the proxy answers itself, each with a status and a JSON body in the OpenAI shape.

use super::ProxyBody;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::time::Duration;

/// A failure the sidecar reports to the client instead of an engine response.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The engine could not be reached or refused the connection.
    #[error("upstream {upstream} is unavailable: {reason}")]
    Unavailable {
        /// The configured upstream.
        upstream: String,
        /// Why, without request content.
        reason: String,
    },
    /// The engine sent no response head in time.
    #[error("upstream {upstream} sent no response within {}", humantime::format_duration(*.after))]
    Timeout {
        /// The configured upstream.
        upstream: String,
        /// The configured response-head timeout.
        after: Duration,
    },
    /// The client's request body could not be read.
    #[error("the request body could not be read: {0}")]
    BadRequestBody(String),
    /// CONNECT (tunnelling) is refused: llmslo is not an open proxy.
    #[error("CONNECT is not supported: llmslo forwards only to its configured upstream")]
    ConnectRefused,
}

impl ProxyError {
    fn status(&self) -> StatusCode {
        match self {
            ProxyError::Unavailable { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::BadRequestBody(_) => StatusCode::BAD_REQUEST,
            ProxyError::ConnectRefused => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ProxyError::Unavailable { .. } => "upstream_unavailable",
            ProxyError::Timeout { .. } => "upstream_timeout",
            ProxyError::BadRequestBody(_) => "bad_request_body",
            ProxyError::ConnectRefused => "method_not_allowed",
        }
    }

    /// The response sent to the client: `{"error":{"message":...,"type":...}}`.
    pub fn into_response(self) -> Response<ProxyBody> {
        let body = serde_json::json!({
            "error": { "message": self.to_string(), "type": self.kind(), "code": self.status().as_u16() }
        });
        Response::builder()
            .status(self.status())
            .header(header::CONTENT_TYPE, "application/json")
            .body(
                Full::new(Bytes::from(body.to_string()))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("static response parts are valid")
    }
}
