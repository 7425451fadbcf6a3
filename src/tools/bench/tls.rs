//! `llmslo bench --tls`: a certificate authority and a certificate for 127.0.0.1 made for one
//! run, which the engine and the proxies serve and the clients and the proxies trust, so that
//! every hop (client to proxy, proxy to engine) is TLS, verified.

use std::path::{Path, PathBuf};

/// The run's CA and the certificate it issued, as PEM files in the run's scratch directory.
#[derive(Debug, Clone)]
pub struct BenchTls {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The certificate for `localhost` and 127.0.0.1.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA, as the clients trust it.
    pub roots: rustls::RootCertStore,
}

impl BenchTls {
    /// Makes the CA and the certificate, written into `dir`.
    pub fn make(dir: &Path) -> Result<Self, String> {
        let failed = |e: rcgen::Error| format!("a certificate for the bench: {e}");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "llmslo bench CA");
        let ca_key = rcgen::KeyPair::generate().map_err(failed)?;
        let ca_cert = ca_params.self_signed(&ca_key).map_err(failed)?;
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(failed)?;
        let key = rcgen::KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &ca_cert, &ca_key).map_err(failed)?;
        let tls = Self {
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            roots: {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca_cert.der().clone()).map_err(|e| e.to_string())?;
                roots
            },
        };
        for (path, pem) in [
            (&tls.ca, ca_cert.pem()),
            (&tls.cert, cert.pem()),
            (&tls.key, key.serialize_pem()),
        ] {
            std::fs::write(path, pem).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(tls)
    }

    /// The certificate as a server of llmslo's serves it.
    pub fn server(&self) -> Result<std::sync::Arc<crate::serve::tls::ServerTls>, String> {
        use crate::serve::tls::{NamedPath, ServerTls, TlsSource};
        let named = |path: &PathBuf| NamedPath {
            path: path.clone(),
            name: "the bench's certificate".into(),
        };
        ServerTls::load(
            TlsSource::Files {
                cert: named(&self.cert),
                key: named(&self.key),
            },
            None,
        )
    }
}
