//! The request path: a stack of tower layers over the forwarding service, from
//! the client inwards:
//!
//! 1. [`guard`]: what a client may send (CONNECT refused, body size, read timeouts and minimum
//!    rate), and the JSON answer to every failure below, the client's fault first.
//! 2. [`observe`]: measures generation requests (public and reusable: `llmslo::ObserveLayer`),
//!    reading what it peeks of the body.
//! 3. [`admit`]: takes an in-flight slot once the request is about to cost the engine.
//! 4. [`deadline`]: the response head must come within `upstream_timeout` of the request
//!    body's end.
//! 5. [`forward`]: sends the request to the one upstream; the response body is under
//!    `stream_idle_timeout`.

pub mod admit;
pub mod deadline;
pub mod error;
pub mod forward;
pub mod guard;
pub mod headers;
pub mod held;
pub mod idle;
pub mod observe;
pub mod peek;
pub mod relay;
pub mod request_body;

use crate::observe::recorder::Recorder;
use crate::upstream::UpstreamClient;
use admit::{Admit, AdmitLayer};
use deadline::{ResponseDeadline, ResponseDeadlineLayer};
use forward::{ClientAddr, Forward};
use guard::{Guard, GuardLayer, GuardSettings};
use http::{Request, Response};
use hyper::body::Incoming;
use observe::{Observe, ObserveLayer, ObserveSettings};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower::{ServiceBuilder, ServiceExt};

pub use crate::upstream::UpstreamBody;

/// Defaults of the request path's settings (the config keys of the same names).
pub mod defaults {
    use std::time::Duration;

    /// `max_body_bytes`: 64 MiB, room for multimodal requests with inline images.
    pub const MAX_BODY_BYTES: u64 = 64 << 20;
    /// `request_body_timeout`.
    pub const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(30);
    /// `request_body_total_timeout`: a 64 MiB body at 2 Mbit/s still arrives.
    pub const REQUEST_BODY_TOTAL_TIMEOUT: Duration = Duration::from_secs(300);
    /// `request_body_min_rate`, bytes per second: a trickle far below any real uplink.
    pub const REQUEST_BODY_MIN_RATE: u64 = 1024;
    /// `max_in_flight_requests`.
    pub const MAX_IN_FLIGHT_REQUESTS: usize = 1024;
    /// `upstream_timeout`.
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(600);
    /// `upstream_idle_timeout`: below the 5 s keep-alive of uvicorn (vLLM, SGLang), so the
    /// sidecar closes an idle engine connection before the engine does.
    pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(4);
    /// `stream_idle_timeout`: engines do hang; a healthy one is never this quiet.
    pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// `inject_usage`: streams are asked for their usage chunk, so token counts are exact.
    pub const INJECT_USAGE: bool = true;
    /// `max_peek_bytes`: 4 MiB.
    pub const MAX_PEEK_BYTES: usize = 4 << 20;
    /// `max_buffered_request_bytes`: 16 MiB, four of the largest peeks at once.
    pub const MAX_BUFFERED_REQUEST_BYTES: usize = 16 << 20;
    /// `max_event_bytes`: 1 MiB.
    pub const MAX_EVENT_BYTES: usize = 1 << 20;
}

/// Body type sent back to the client.
pub type ProxyBody = crate::body::BoxBody;

/// Proxy settings taken from the configuration.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// The upstream as configured, for error messages.
    pub upstream: String,
    /// Largest generation request body accepted (413 beyond it).
    pub max_body_bytes: u64,
    /// Longest gap between two reads of a request body (408 beyond it).
    pub request_body_timeout: Duration,
    /// Longest a whole request body may take to arrive (408 beyond it).
    pub request_body_total_timeout: Duration,
    /// Slowest a request body may arrive on average, bytes per second (408 below it); 0 is off.
    pub request_body_min_rate: u64,
    /// Requests forwarded at once (503 beyond it).
    pub max_in_flight_requests: usize,
    /// Of those, the most one client address may hold (429 beyond it).
    pub max_in_flight_per_client: usize,
    /// How long the upstream may take to send a response head.
    pub upstream_timeout: Duration,
    /// Longest silence of the upstream within a response body; `None` waits for ever.
    pub stream_idle_timeout: Option<Duration>,
    /// How requests and responses are observed.
    pub observe: ObserveSettings,
}

/// The sidecar's request path: one assembly of the layers, shared by all connections.
#[derive(Debug, Clone)]
pub struct Proxy {
    stack: Guard<Observe<Admit<ResponseDeadline<Forward>>>>,
}

impl Proxy {
    /// A proxy to `client`'s upstream, recording into `recorder`.
    pub fn new(client: UpstreamClient, recorder: Arc<Recorder>, settings: ProxySettings) -> Self {
        let guard = GuardSettings {
            upstream: settings.upstream.clone(),
            max_body_bytes: settings.max_body_bytes,
            request_body_timeout: settings.request_body_timeout,
            request_body_total_timeout: settings.request_body_total_timeout,
            request_body_min_rate: settings.request_body_min_rate,
            upstream_timeout: settings.upstream_timeout,
            max_event_bytes: settings.observe.max_event_bytes,
        };
        let stack = ServiceBuilder::new()
            .layer(GuardLayer::new(recorder.clone(), guard))
            .layer(ObserveLayer::new(recorder, settings.observe))
            .layer(AdmitLayer::new(
                settings.max_in_flight_requests,
                settings.max_in_flight_per_client,
            ))
            .layer(ResponseDeadlineLayer::new(settings.upstream_timeout))
            .service(Forward::new(client, &settings.upstream, settings.stream_idle_timeout));
        Self { stack }
    }

    /// Forwards one client request from `peer`: the future of the (observed) response. A plain
    /// function, so that the future holds the request once, inside the layers' own future.
    pub fn handle(
        &self,
        mut request: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = Result<Response<ProxyBody>, Infallible>> + Send + 'static {
        request.extensions_mut().insert(ClientAddr(peer));
        self.stack.clone().oneshot(request)
    }
}
