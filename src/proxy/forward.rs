//! The innermost service: sends a request to the one upstream and hands back its response,
//! the body under the stream idle timeout. Its errors are [`ProxyError`]s.

use super::error::ProxyError;
use super::headers;
use super::idle::IdleTimeoutBody;
use super::UpstreamBody;
use crate::metrics::RefusalReason;
use crate::upstream::{innermost_cause, BoxError, ResponseBody, UpstreamClient};
use http::{header, HeaderValue, Request, Response, StatusCode, Version};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The client's address, carried in the request's extensions for `X-Forwarded-For`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// Forwards requests to the upstream of its client.
#[derive(Debug, Clone)]
pub struct Forward {
    client: UpstreamClient,
    /// The upstream as configured, for error messages.
    upstream: Arc<str>,
    /// Longest silence of the upstream within a response body; `None` waits for ever.
    stream_idle_timeout: Option<Duration>,
}

impl Forward {
    /// Forwards to `client`'s upstream (named `upstream` in errors).
    pub fn new(client: UpstreamClient, upstream: &str, stream_idle_timeout: Option<Duration>) -> Self {
        Self {
            client,
            upstream: upstream.into(),
            stream_idle_timeout,
        }
    }

    /// Points the request at the upstream: origin-form URI, HTTP/1.1, end-to-end headers only.
    fn prepare_head(&self, parts: &mut http::request::Parts) {
        headers::remove_hop_by_hop(&mut parts.headers);
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        // An HTTP/2 client names the host in :authority; HTTP/1.1 engines expect a Host header.
        if !parts.headers.contains_key(header::HOST) {
            if let Some(host) = parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                parts.headers.insert(header::HOST, host);
            }
        }
        parts.uri = self.client.uri_for(path_and_query);
        parts.version = Version::HTTP_11;
        if let Some(ClientAddr(peer)) = parts.extensions.get::<ClientAddr>() {
            headers::append_forwarded_for(&mut parts.headers, peer.ip());
        }
    }
}

impl tower::Service<Request<UpstreamBody>> for Forward {
    type Response = Response<IdleTimeoutBody<ResponseBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<UpstreamBody>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        self.prepare_head(&mut parts);
        let this = self.clone();
        Box::pin(async move {
            let response = this
                .client
                .send(Request::from_parts(parts, body))
                .await
                .map_err(|error| {
                    if error.is_connect() && out_of_file_descriptors(&error) {
                        // The sidecar's own exhaustion, never the engine's fault.
                        return ProxyError::Overloaded(RefusalReason::FileDescriptors);
                    }
                    ProxyError::Unavailable {
                        upstream: this.upstream.to_string(),
                        reason: innermost_cause(&error),
                        connect: error.is_connect(),
                    }
                })?;
            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                // llmslo never forwards Upgrade, so no 101 was asked for: the engine misbehaved.
                return Err(ProxyError::BadUpstreamResponse {
                    upstream: this.upstream.to_string(),
                    what: "101 Switching Protocols to a request that asked for no upgrade",
                }
                .into());
            }
            let (mut parts, body) = response.into_parts();
            headers::remove_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(
                parts,
                IdleTimeoutBody::new(body, this.stream_idle_timeout),
            ))
        })
    }
}

/// The process (EMFILE) or the system (ENFILE) is out of file descriptors: the socket for the
/// engine could not even be created.
fn out_of_file_descriptors(error: &(dyn std::error::Error + 'static)) -> bool {
    /// `ENFILE` and `EMFILE`, the same on Linux and the BSDs.
    const TOO_MANY_OPEN_FILES: [i32; 2] = [23, 24];
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io
                .raw_os_error()
                .is_some_and(|code| TOO_MANY_OPEN_FILES.contains(&code))
            {
                return true;
            }
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connect failed")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn emfile_anywhere_in_the_chain_is_the_sidecars_exhaustion() {
        assert!(out_of_file_descriptors(&Wrapped(std::io::Error::from_raw_os_error(24))));
        assert!(out_of_file_descriptors(&std::io::Error::from_raw_os_error(23)));
        // Connection refused (111) is the engine's side.
        assert!(!out_of_file_descriptors(&Wrapped(std::io::Error::from_raw_os_error(
            111
        ))));
    }
}
