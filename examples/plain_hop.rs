//! The hop without the measurement: hyper's HTTP/1.1 server and llmslo's engine connections,
//! assembled as `llmslo run` assembles them (one task per stream, the engine's connection
//! driven by the body that reads it), with every byte passed through unobserved. Run beside
//! `llmslo run` and nginx, it splits what llmslo costs into what the hop costs and what the
//! measurement adds.
//!
//! ```sh
//! cargo run --release --example plain_hop -- http://127.0.0.1:8000 127.0.0.1:8080
//! ```

use http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use llmslo::own_wake::OnOwnWakeBody;
use llmslo::proxy::defaults::{MAX_IN_FLIGHT_REQUESTS, UPSTREAM_IDLE_TIMEOUT};
use llmslo::upstream::{BoxError, UpstreamClient};
use tokio::net::TcpListener;

/// The allocator `llmslo run` has, so that the two differ only in the measurement.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// And its settings (see `src/main.rs`).
#[export_name = "_rjem_malloc_conf"]
static JEMALLOC_CONF: &[u8; 20] = b"dirty_decay_ms:1000\0";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: plain_hop UPSTREAM_URI LISTEN_ADDRESS";
    let upstream: http::Uri = args.next().ok_or(usage)?.parse()?;
    let listen = args.next().ok_or(usage)?;
    // Pooled as `llmslo run` pools with its default limits.
    let client = UpstreamClient::new(&upstream, MAX_IN_FLIGHT_REQUESTS, UPSTREAM_IDLE_TIMEOUT);
    let listener = TcpListener::bind(&listen).await?;
    // Ctrl-C ends it as a process ends (a profiling build writes its profile then).
    tokio::select! {
        served = serve(listener, client) => served,
        stopped = tokio::signal::ctrl_c() => Ok(stopped?),
    }
}

/// Serves every connection `listener` accepts through `client`.
async fn serve(listener: TcpListener, client: UpstreamClient) -> Result<(), BoxError> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let forward = service_fn(move |request: Request<Incoming>| {
                let client = client.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    parts.uri = client.uri_for(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
                    let body = body.map_err(BoxError::from).boxed_unsync();
                    let response = client.send(Request::from_parts(parts, body)).await;
                    // As `llmslo run` serves it: hyper's second ask per wake-up goes no further.
                    response.map(|response| response.map(OnOwnWakeBody::new))
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), forward)
                .await;
        });
    }
}
