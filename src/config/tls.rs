//! `tls:`, `metrics_tls`, `upstream_tls:` and `prefill_tls:`: TLS on the sidecar's ports, to an
//! https engine and on the prefill relay's hops, as the file writes them and as flags and the
//! environment override them.

use super::error::ConfigError;
use super::{origin_label, Overrides};
use crate::serve::tls::{NamedPath, TlsSource};
use crate::upstream::tls::UpstreamTls;
use http::Uri;
use serde::Deserialize;
use std::path::PathBuf;

/// `tls:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    self_signed: Option<bool>,
}

/// `upstream_tls:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpstreamTlsFile {
    ca_file: Option<PathBuf>,
    server_name: Option<String>,
    insecure_skip_verify: Option<bool>,
}

/// `prefill_tls:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PrefillTlsFile {
    enabled: Option<bool>,
    ca_file: Option<PathBuf>,
    insecure_skip_verify: Option<bool>,
}

/// How the prefill relay's legs are verified, when it speaks TLS: on when `enabled` (or a flag)
/// says so, or when a verification setting is given; a CA file beside skipping verification is
/// an error.
pub(super) fn prefill_tls(o: &Overrides, f: Option<PrefillTlsFile>) -> Result<Option<UpstreamTls>, ConfigError> {
    let f = f.unwrap_or_default();
    let settings = UpstreamTls {
        ca_file: o.prefill_ca_file.clone().or(f.ca_file),
        server_name: None,
        insecure_skip_verify: o
            .prefill_insecure_skip_verify
            .or(f.insecure_skip_verify)
            .unwrap_or(false),
    };
    let enabled = o.prefill_tls.or(f.enabled).unwrap_or(settings.is_set());
    if !enabled {
        return Ok(None);
    }
    if settings.insecure_skip_verify && settings.ca_file.is_some() {
        return Err(ConfigError::invalid(
            "prefill_tls.insecure_skip_verify",
            "verifies nothing, so a ca_file beside it would not be used: keep one of the two",
        ));
    }
    Ok(Some(settings))
}

/// How the proxy's port serves TLS, if it does: files (each named in errors as it was given)
/// or a certificate made at start, never both.
pub(super) fn listener_tls(o: &Overrides, f: Option<TlsFile>) -> Result<Option<TlsSource>, ConfigError> {
    let f = f.unwrap_or_default();
    let name = |key: &'static str, file_key: &str| match o.origin(key) {
        Some(origin) => origin,
        None => format!("tls.{file_key}"),
    };
    let cert = o.tls_cert_file.clone().or(f.cert_file).map(|path| NamedPath {
        path,
        name: name("tls_cert_file", "cert_file"),
    });
    let key = o.tls_key_file.clone().or(f.key_file).map(|path| NamedPath {
        path,
        name: name("tls_key_file", "key_file"),
    });
    let self_signed = o.tls_self_signed.or(f.self_signed).unwrap_or(false);
    match (cert, key, self_signed) {
        (None, None, false) => Ok(None),
        (None, None, true) => Ok(Some(TlsSource::SelfSigned)),
        (Some(_), _, true) | (_, Some(_), true) => Err(ConfigError::invalid(
            "tls.self_signed",
            "a certificate is made at start or read from tls.cert_file and tls.key_file, not both",
        )),
        (Some(cert), Some(key), false) => Ok(Some(TlsSource::Files { cert, key })),
        (Some(cert), None, false) => Err(ConfigError::invalid(
            "tls.key_file",
            format!("{} needs its private key too", cert.name),
        )),
        (None, Some(key), false) => Err(ConfigError::invalid(
            "tls.cert_file",
            format!("{} needs its certificate too", key.name),
        )),
    }
}

/// How an https upstream is verified; any setting on an http upstream is an error, and so is
/// skipping verification for an engine that is not on this host.
pub(super) fn upstream_tls(
    o: &Overrides,
    f: Option<UpstreamTlsFile>,
    upstream: &Uri,
) -> Result<UpstreamTls, ConfigError> {
    let f = f.unwrap_or_default();
    let settings = UpstreamTls {
        ca_file: o.upstream_ca_file.clone().or(f.ca_file),
        server_name: f.server_name,
        insecure_skip_verify: o
            .upstream_insecure_skip_verify
            .or(f.insecure_skip_verify)
            .unwrap_or(false),
    };
    if !settings.is_set() {
        return Ok(settings);
    }
    if upstream.scheme_str() != Some("https") {
        return Err(ConfigError::invalid(
            "upstream_tls",
            "applies to an https:// upstream; this one is plain http",
        ));
    }
    if settings.insecure_skip_verify && settings.ca_file.is_some() {
        return Err(ConfigError::invalid(
            "upstream_tls.insecure_skip_verify",
            "verifies nothing, so a ca_file beside it would not be used: keep one of the two",
        ));
    }
    let host = upstream.host().unwrap_or_default();
    if settings.insecure_skip_verify && !on_this_host(host) {
        return Err(ConfigError::invalid(
            "upstream_tls.insecure_skip_verify",
            format!(
                "is only for an engine on this host (127.0.0.1, ::1, localhost), not `{host}`: name its CA in \
                 upstream_tls.ca_file ({})",
                origin_label("upstream_ca_file", false)
            ),
        ));
    }
    Ok(settings)
}

/// `localhost` or a loopback address.
fn on_this_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_engine_on_this_host_may_skip_verification() {
        for host in ["localhost", "127.0.0.1", "[::1]", "127.0.0.9"] {
            assert!(
                on_this_host(host.trim_start_matches('[').trim_end_matches(']')) || on_this_host(host),
                "{host}"
            );
        }
        for host in ["10.0.0.1", "vllm.svc", "localhost.example.com", "0.0.0.0"] {
            assert!(!on_this_host(host), "{host}");
        }
    }
}
