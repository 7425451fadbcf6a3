//! TLS for llmslo's servers: a certificate and key read from PEM files, or made at start, with
//! ALPN offering h2 and http/1.1. Files that change (cert-manager renewing them, a Secret's
//! atomic symlink swap) are loaded again within [`RELOAD_EVERY`] and served to new
//! connections, open ones keeping theirs; a change that does not load leaves the previous
//! certificate in force and says so. The certificate's expiry and the reloads are metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the files are checked for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// A file the user named, and how errors name it (the flag or key it came from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPath {
    /// Where the file is.
    pub path: PathBuf,
    /// The flag, variable or key that named it, like `flag --tls-cert-file`.
    pub name: String,
}

impl std::fmt::Display for NamedPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.path.display())
    }
}

/// Where a server's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// A PEM certificate chain and its private key.
    Files {
        /// The chain, leaf first.
        cert: NamedPath,
        /// Its private key.
        key: NamedPath,
    },
    /// A certificate made at start for `localhost`, the loopback addresses and the host's own
    /// name and address (`HOSTNAME`, `POD_IP`), as the component llmslo stands in for would.
    SelfSigned,
}

/// `result`: whether a changed certificate loaded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

/// A server's TLS: the acceptor in force, and how to renew it.
pub struct ServerTls {
    source: TlsSource,
    client_ca: Option<NamedPath>,
    acceptor: RwLock<TlsAcceptor>,
    /// What the files looked like when last read (so a change that failed is not retried until
    /// they change again).
    stamp: Mutex<Option<Stamp>>,
    reloads: Family<ReloadLabels, Counter>,
    expiry: Gauge<f64, AtomicU64>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A file's identity and version: its inode, size and modification time (through symlinks).
type Stamp = Vec<(u64, u64, i64, i64)>;

impl ServerTls {
    /// Loads the certificate (or makes one); with `client_ca`, only clients presenting a
    /// certificate it signed complete the handshake. An error names the file and what is wrong.
    pub fn load(source: TlsSource, client_ca: Option<NamedPath>) -> Result<Arc<Self>, String> {
        let (acceptor, expiry) = build(&source, client_ca.as_ref())?;
        let tls = Self {
            stamp: Mutex::new(stamp(&source, client_ca.as_ref())),
            source,
            client_ca,
            acceptor: RwLock::new(acceptor),
            reloads: Family::default(),
            expiry: Gauge::default(),
        };
        tls.expiry.set(expiry);
        Ok(Arc::new(tls))
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().expect("tls lock").clone()
    }

    /// Registers `llmslo_tls_cert_expiry_timestamp_seconds` and `llmslo_tls_cert_reloads_total`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "llmslo_tls_cert_expiry_timestamp_seconds",
            "When the certificate llmslo serves expires (its notAfter), in Unix seconds",
            self.expiry.clone(),
        );
        registry.register(
            "llmslo_tls_cert_reloads",
            "Changed certificate files loaded (result=success) or refused, the previous certificate kept \
             (result=failure)",
            self.reloads.clone(),
        );
        for result in ["success", "failure"] {
            drop(self.reloads.get_or_create(&ReloadLabels { result }));
        }
    }

    /// Loads the files again when they changed; a change that does not load is logged and
    /// counted, and the certificate in force stays.
    pub fn reload_if_changed(&self) {
        let now = stamp(&self.source, self.client_ca.as_ref());
        {
            let mut last = self.stamp.lock().expect("tls lock");
            if now.is_none() || *last == now {
                return;
            }
            *last = now;
        }
        match build(&self.source, self.client_ca.as_ref()) {
            Ok((acceptor, expiry)) => {
                *self.acceptor.write().expect("tls lock") = acceptor;
                self.expiry.set(expiry);
                self.reloads.get_or_create(&ReloadLabels { result: "success" }).inc();
                info!(expires = expiry, "TLS certificate reloaded");
            }
            Err(error) => {
                self.reloads.get_or_create(&ReloadLabels { result: "failure" }).inc();
                warn!(%error, "the changed TLS files do not load: serving the previous certificate");
            }
        }
    }

    /// Checks the files every [`RELOAD_EVERY`] until `shutdown`.
    pub async fn keep_current(self: Arc<Self>, shutdown: CancellationToken) {
        if self.source == TlsSource::SelfSigned && self.client_ca.is_none() {
            return;
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RELOAD_EVERY) => self.reload_if_changed(),
            }
        }
    }
}

/// The files' stamps, or `None` while one cannot be read (mid-swap).
fn stamp(source: &TlsSource, client_ca: Option<&NamedPath>) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let files: Vec<&NamedPath> = match source {
        TlsSource::Files { cert, key } => vec![cert, key],
        TlsSource::SelfSigned => Vec::new(),
    };
    files
        .into_iter()
        .chain(client_ca)
        .map(|file| {
            let m = std::fs::metadata(&file.path).ok()?;
            Some((m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

/// The acceptor for `source`, and when its certificate expires (Unix seconds).
fn build(source: &TlsSource, client_ca: Option<&NamedPath>) -> Result<(TlsAcceptor, f64), String> {
    let (chain, key) = match source {
        TlsSource::Files { cert, key } => read_pair(cert, key)?,
        TlsSource::SelfSigned => self_signed()?,
    };
    let expiry = not_after(&chain[0]).map_err(|e| match source {
        TlsSource::Files { cert, .. } => format!("{cert}: {e}"),
        TlsSource::SelfSigned => e,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), expiry))
}

type Pair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// A PEM chain and key; an error names the file.
fn read_pair(cert: &NamedPath, key: &NamedPath) -> Result<Pair, String> {
    let chain = CertificateDer::pem_file_iter(&cert.path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{cert}: {}", pem_error(&e)))?;
    if chain.is_empty() {
        return Err(format!("{cert}: no certificate in the file"));
    }
    let private = PrivateKeyDer::from_pem_file(&key.path).map_err(|e| format!("{key}: {}", pem_error(&e)))?;
    Ok((chain, private))
}

/// What went wrong reading a PEM file, in words.
fn pem_error(error: &rustls::pki_types::pem::Error) -> String {
    match error {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of the expected kind in the file".into(),
        other => format!("not a PEM file ({other:?})"),
    }
}

/// A certificate valid for ten years from an hour ago, for the names this host answers to.
fn self_signed() -> Result<Pair, String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    for variable in ["HOSTNAME", "POD_IP"] {
        if let Some(value) = std::env::var(variable).ok().filter(|v| !v.is_empty() && v.len() <= 253) {
            names.push(value);
        }
    }
    let mut params = rcgen::CertificateParams::new(names).map_err(|e| format!("a self-signed certificate: {e}"))?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    let key = rcgen::KeyPair::generate().map_err(|e| format!("a self-signed certificate's key: {e}"))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("a self-signed certificate: {e}"))?;
    let private = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| format!("a self-signed key: {e}"))?;
    Ok((vec![cert.der().clone()], private))
}

/// The certificate's notAfter, in Unix seconds.
fn not_after(cert: &CertificateDer<'_>) -> Result<f64, String> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(parsed.validity().not_after.timestamp() as f64)
}

/// Verifies clients against the CA certificates in `ca`.
fn client_verifier(
    ca: &NamedPath,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(&ca.path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{ca}: {}", pem_error(&e)))?;
    for certificate in certificates {
        roots.add(certificate).map_err(|e| format!("{ca}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{ca}: no certificate in the file"));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("{ca}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &std::path::Path, name: &str, days: i64) -> (NamedPath, NamedPath) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (
            NamedPath {
                path: c,
                name: "--tls-cert-file".into(),
            },
            NamedPath {
                path: k,
                name: "--tls-key-file".into(),
            },
        )
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("llmslo-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_changed_pair_is_loaded_and_a_broken_change_keeps_the_old_one() {
        let dir = scratch("reload");
        let (cert, key) = write_pair(&dir, "a", 30);
        let tls = ServerTls::load(
            TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            None,
        )
        .unwrap();
        let first = tls.expiry.get();
        let in_days = (first - time::OffsetDateTime::now_utc().unix_timestamp() as f64) / 86_400.0;
        assert!((29.9..30.1).contains(&in_days), "{in_days}");
        // Rotated, as a Secret's symlink swap does: new files under the same names.
        let (new_cert, new_key) = write_pair(&dir, "b", 90);
        std::fs::rename(&new_cert.path, &cert.path).unwrap();
        std::fs::rename(&new_key.path, &key.path).unwrap();
        tls.reload_if_changed();
        assert!(tls.expiry.get() > first + 59.0 * 86_400.0);
        assert_eq!(tls.reloads.get_or_create(&ReloadLabels { result: "success" }).get(), 1);
        // Caught mid-update: a key that is not one. The previous certificate stays.
        std::fs::write(&key.path, "not a key").unwrap();
        tls.reload_if_changed();
        tls.reload_if_changed();
        assert_eq!(
            tls.reloads.get_or_create(&ReloadLabels { result: "failure" }).get(),
            1,
            "counted once per change"
        );
        assert!(tls.expiry.get() > first + 59.0 * 86_400.0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_or_wrong_file_is_an_error_naming_it() {
        let dir = scratch("errors");
        let (cert, key) = write_pair(&dir, "a", 30);
        let load = |cert: &NamedPath, key: &NamedPath| {
            ServerTls::load(
                TlsSource::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                },
                None,
            )
            .unwrap_err()
        };
        let missing = NamedPath {
            path: dir.join("nope.crt"),
            name: "--tls-cert-file".into(),
        };
        let error = load(&missing, &key);
        assert!(
            error.starts_with(&format!("--tls-cert-file {}: ", missing.path.display()))
                && error.contains("No such file"),
            "{error}"
        );
        // Each file given where the other belongs.
        let swapped = |file: &NamedPath, name: &NamedPath| NamedPath {
            path: file.path.clone(),
            name: name.name.clone(),
        };
        let error = load(&swapped(&key, &cert), &key);
        assert!(
            error.starts_with("--tls-cert-file") && error.ends_with("no certificate in the file"),
            "{error}"
        );
        let error = load(&cert, &swapped(&cert, &key));
        assert!(
            error.starts_with("--tls-key-file") && error.contains("no PEM item"),
            "{error}"
        );
        let (_, other_key) = write_pair(&dir, "b", 30);
        assert!(load(&cert, &other_key).contains("do not fit together"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_self_signed_certificate_is_made_for_this_host() {
        let tls = ServerTls::load(TlsSource::SelfSigned, None).unwrap();
        let years = (tls.expiry.get() - time::OffsetDateTime::now_utc().unix_timestamp() as f64) / (365.0 * 86_400.0);
        assert!((9.9..10.1).contains(&years), "{years}");
    }
}
