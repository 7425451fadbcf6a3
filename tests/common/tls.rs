//! HTTPS on 127.0.0.1 as the Kubernetes API server calls a webhook: trusting only the given
//! roots and naming the given host.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;

/// A TLS connection to `addr`, the certificate verified for `host` against `roots`.
pub async fn connect(
    addr: SocketAddr,
    roots: &rustls::RootCertStore,
    host: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(host.to_string()).unwrap(), tcp)
        .await
}

/// Sends `request` over a new TLS connection to `addr`, verifying the certificate for `host`
/// against `roots`; a handshake failure is the error. Returns the status and the body.
pub async fn https(
    addr: SocketAddr,
    roots: &rustls::RootCertStore,
    host: &str,
    request: http::Request<Full<Bytes>>,
) -> std::io::Result<(u16, Bytes)> {
    let tls = connect(addr, roots, host).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(connection);
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await.unwrap().to_bytes()))
}
