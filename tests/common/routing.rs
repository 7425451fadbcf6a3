//! The simulator's routing sidecar (llm-d's P/D protocol) on 127.0.0.1, for the tests.

use llmslo::serve::tls::ServerTls;
use llmslo::tools::simulate::routing::RoutingSidecar;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Starts the routing sidecar on 127.0.0.1:0 in front of the decode engine at `decode`.
pub async fn start_routing_sidecar(decode: SocketAddr) -> SocketAddr {
    start_routing_sidecar_at("127.0.0.1:0".parse().unwrap(), decode).await
}

/// Starts the routing sidecar on `listen` in front of the decode engine at `decode`.
pub async fn start_routing_sidecar_at(listen: SocketAddr, decode: SocketAddr) -> SocketAddr {
    start(listen, decode, None).await
}

/// Starts the routing sidecar with its SSRF protection on: legs go to `allowed` alone.
pub async fn start_protected_routing_sidecar(decode: SocketAddr, allowed: &[SocketAddr]) -> SocketAddr {
    start("127.0.0.1:0".parse().unwrap(), decode, Some(allowed.to_vec())).await
}

/// Starts the routing sidecar on `listen` in front of the decode engine at `decode`, serving
/// TLS with `tls` as llm-d's does unless told not to.
pub async fn start_secure_routing_sidecar_at(
    listen: SocketAddr,
    decode: SocketAddr,
    tls: Arc<ServerTls>,
) -> SocketAddr {
    serve(listen, decode, None, Some(tls)).await
}

/// [`start_secure_routing_sidecar_at`], speaking TLS to prefill pods (unverified), as
/// `--enable-tls=prefiller --tls-insecure-skip-verify=prefiller` has llm-d's do.
pub async fn start_routing_sidecar_with_tls_to_prefill_at(
    listen: SocketAddr,
    decode: SocketAddr,
    tls: Arc<ServerTls>,
) -> SocketAddr {
    let listener = TcpListener::bind(listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = RoutingSidecar::with_tls_to_prefill(decode, None);
    tokio::spawn(router.serve(listener, Some(tls), CancellationToken::new()));
    addr
}

async fn start(listen: SocketAddr, decode: SocketAddr, allowed: Option<Vec<SocketAddr>>) -> SocketAddr {
    serve(listen, decode, allowed, None).await
}

async fn serve(
    listen: SocketAddr,
    decode: SocketAddr,
    allowed: Option<Vec<SocketAddr>>,
    tls: Option<Arc<ServerTls>>,
) -> SocketAddr {
    let listener = TcpListener::bind(listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Serves until the test's runtime ends.
    tokio::spawn(RoutingSidecar::new(decode, allowed).serve(listener, tls, CancellationToken::new()));
    addr
}
