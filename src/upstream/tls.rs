//! TLS to an `https://` engine: verified against the public roots built in or a CA file, under
//! the upstream's host name or one stated; or, for an engine on this host that made its own
//! certificate (what KServe and llm-d generate), not verified at all, by choice.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::PathBuf;
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// How an https upstream is verified (`upstream_tls:`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// PEM CA certificates to verify the engine with, instead of the public roots.
    pub ca_file: Option<PathBuf>,
    /// The name its certificate must hold, instead of the upstream's host.
    pub server_name: Option<String>,
    /// Take any certificate: only for an engine on this host (the config refuses others).
    pub insecure_skip_verify: bool,
}

impl UpstreamTls {
    /// Whether any setting differs from the defaults.
    pub fn is_set(&self) -> bool {
        *self != Self::default()
    }
}

/// What a connection to the engine is wrapped in: the connector and the name it checks.
#[derive(Clone)]
pub struct EngineTls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for EngineTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineTls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EngineTls {
    /// The TLS for an engine at `host` as `settings` say; an error names what does not load.
    pub fn new(host: &str, settings: &UpstreamTls) -> Result<Self, String> {
        let mut config = client_config(settings, "upstream_tls")?;
        // h2 where the engine serves it (one connection for every stream), else HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let name = settings
            .server_name
            .as_deref()
            .unwrap_or(host.trim_start_matches('[').trim_end_matches(']'));
        let name = ServerName::try_from(name.to_string())
            .map_err(|_| format!("upstream_tls.server_name `{name}` is not a DNS name or an IP address"))?;
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// Wraps a connection to the engine in TLS.
    pub async fn connect(
        &self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector.connect(self.name.clone(), stream).await
    }
}

/// A TLS client's settings as `settings` (the config's `key`) say, without ALPN: verified
/// against the CA file or the public roots, or not at all; an error names what does not load.
pub fn client_config(settings: &UpstreamTls, key: &str) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    Ok(if settings.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        builder
            .with_root_certificates(roots(settings, key)?)
            .with_no_client_auth()
    })
}

/// The CA file's certificates, or the public roots built in.
fn roots(settings: &UpstreamTls, key: &str) -> Result<rustls::RootCertStore, String> {
    let Some(path) = &settings.ca_file else {
        return Ok(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        });
    };
    let named = format!("{key}.ca_file {}", path.display());
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{named}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in certificates {
        roots.add(certificate).map_err(|e| format!("{named}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{named}: no certificate in the file"));
    }
    Ok(roots)
}

/// Takes the engine's certificate unverified (`insecure_skip_verify`), still checking that the
/// engine holds its key.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
