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

/// A certificate authority made for one test, and the certificates it issues, written as PEM
/// files in a scratch directory of the test's own.
pub struct TestCa {
    /// Where the files are written.
    pub dir: std::path::PathBuf,
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    /// A new CA whose files go in a fresh directory named after `test`; its certificate is
    /// written as `ca.crt`.
    pub fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("llmslo-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("llmslo test CA {test}"));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("ca.crt"), cert.pem()).unwrap();
        Self { dir, cert, key }
    }

    /// Where the CA's own certificate is.
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.join("ca.crt")
    }

    /// The CA as the only root a client trusts.
    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        roots
    }

    /// Issues a certificate for `localhost` and 127.0.0.1 valid for `days`, written as
    /// `{name}.crt` and `{name}.key`; returns their paths.
    pub fn issue(&self, name: &str, days: i64) -> (std::path::PathBuf, std::path::PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (cert_file, key_file) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TLS connection to `addr` offering `alpn`, verified for `localhost` against `roots`.
pub async fn connect_alpn(
    addr: SocketAddr,
    roots: &rustls::RootCertStore,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}
