//! The bounded request peek: reads a generation request's body far enough to learn its
//! `model` and `stream` fields, then forwards the very same bytes.

use super::UpstreamBody;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use serde::Deserialize;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The request fields llmslo reads; everything else in the body is skipped.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
pub struct RequestFields {
    /// `model`, when the body is JSON with a string model.
    #[serde(default)]
    pub model: Option<String>,
    /// `stream`, when present.
    #[serde(default)]
    pub stream: Option<bool>,
}

/// Parses the fields from a whole body; malformed JSON yields no fields (the engine answers it).
pub fn parse_fields(body: &[u8]) -> RequestFields {
    serde_json::from_slice(body).unwrap_or_default()
}

/// Reads up to `limit` bytes of `body`; returns the body to forward (the same bytes) and the
/// fields when the whole body fit within the limit.
pub async fn peek(
    mut body: Incoming,
    content_length: Option<u64>,
    limit: usize,
) -> Result<(UpstreamBody, RequestFields), hyper::Error> {
    if content_length.is_some_and(|len| len > limit as u64) {
        return Ok((body.boxed_unsync(), RequestFields::default()));
    }
    let mut peeked = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue; // request trailers carry nothing llmslo reads
        };
        peeked.extend_from_slice(&data);
        if peeked.len() > limit {
            let prefixed = PrefixedBody {
                prefix: Some(peeked.freeze()),
                rest: body,
            };
            return Ok((prefixed.boxed_unsync(), RequestFields::default()));
        }
    }
    let whole = peeked.freeze();
    let fields = parse_fields(&whole);
    Ok((Full::new(whole).map_err(|never| match never {}).boxed_unsync(), fields))
}

/// Already-read bytes followed by the rest of the client's body.
struct PrefixedBody {
    prefix: Option<Bytes>,
    rest: Incoming,
}

impl Body for PrefixedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + prefix);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + prefix);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_only_model_and_stream() {
        let f = parse_fields(br#"{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}"#);
        assert_eq!(f.model.as_deref(), Some("llama"));
        assert_eq!(f.stream, Some(true));
    }

    #[test]
    fn malformed_or_odd_bodies_give_no_fields() {
        for body in [&b"{not json"[..], b"", b"[]", br#"{"model":42}"#, b"\xff"] {
            assert_eq!(parse_fields(body), RequestFields::default(), "{body:?}");
        }
    }
}
