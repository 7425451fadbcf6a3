//! The simulated engine's answers: JSON responses, its errors, and the streamed body its
//! generating task feeds.

use super::shape::error_body;
use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

pub(super) type SimBody = http_body_util::combinators::UnsyncBoxBody<Bytes, SimAbort>;

/// The error that makes hyper cut the connection mid-body (an abrupt close).
#[derive(Debug, thiserror::Error)]
#[error("simulated engine aborted the response")]
pub struct SimAbort;

pub(super) fn json_response(status: StatusCode, body: String) -> Response<SimBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .expect("static response parts are valid")
}

pub(super) fn not_found() -> Response<SimBody> {
    json_response(
        StatusCode::NOT_FOUND,
        error_body("Not Found", "NotFoundError", 404).to_string(),
    )
}

pub(super) fn bad_request(message: &str) -> Response<SimBody> {
    json_response(
        StatusCode::BAD_REQUEST,
        error_body(message, "BadRequestError", 400).to_string(),
    )
}

/// A response body fed by the generating task.
pub(super) struct ChannelBody(pub(super) mpsc::Receiver<Result<Frame<Bytes>, SimAbort>>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = SimAbort;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, SimAbort>>> {
        self.0.poll_recv(cx)
    }
}
