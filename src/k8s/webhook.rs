//! `llmslo webhook`: a MutatingAdmissionWebhook (admission.k8s.io/v1) that injects the
//! sidecar into Pods created with `llmslo.io/inject: "true"`, answering with a JSONPatch.
//! It never fails a Pod: anything it does not understand is allowed unchanged, with a warning.

use crate::k8s::inject::{self, inject_pod_template, InjectOptions};
use base64::Engine as _;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Largest AdmissionReview accepted (the API server sends far less).
const MAX_REVIEW_BYTES: usize = 4 << 20;

/// Loads a PEM certificate chain and private key into a TLS acceptor.
fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("--tls-cert {}: no certificate in the file", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not fit together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The certificate and key files, re-read when they change (cert-manager renews them in place),
/// so a renewed certificate is served without a restart.
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<(Option<SystemTime>, TlsAcceptor)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

impl TlsFiles {
    /// Loads both files; an error names the flag and the file.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let acceptor = tls_acceptor(cert, key)?;
        Ok(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: Mutex::new((modified(cert, key), acceptor)),
        })
    }

    /// The acceptor for a new connection: reloaded first when either file changed. A changed
    /// pair that does not load (caught mid-update) is logged and the previous one kept.
    pub fn acceptor(&self) -> TlsAcceptor {
        let stamp = modified(&self.cert, &self.key);
        let mut current = self.current.lock().expect("tls lock");
        if stamp.is_some() && stamp != current.0 {
            match tls_acceptor(&self.cert, &self.key) {
                Ok(acceptor) => {
                    info!(cert = %self.cert.display(), "TLS certificate reloaded");
                    *current = (stamp, acceptor);
                }
                Err(error) => {
                    warn!(%error, "the changed TLS files do not load; serving the previous certificate");
                    current.0 = stamp; // retried when the files change again, not per connection
                }
            }
        }
        current.1.clone()
    }
}

/// The later modification time of the two files (through symlinks, as Secret volumes use).
fn modified(cert: &Path, key: &Path) -> Option<SystemTime> {
    let time = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    Some(time(cert)?.max(time(key)?))
}

/// Connections open at once (the API servers keep a few each).
const WEBHOOK_MAX_CONNECTIONS: usize = 1024;

/// Serves the webhook over TLS on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, tls: Arc<TlsFiles>, options: InjectOptions, shutdown: CancellationToken) {
    let options = Arc::new(options);
    crate::serve::serve_with(
        listener,
        move |stream| {
            let acceptor = tls.acceptor();
            async move { acceptor.accept(stream).await }
        },
        move |request, _peer| handle(request, options.clone()),
        shutdown,
        Duration::from_secs(10),
        crate::serve::ConnectionLimits::new(WEBHOOK_MAX_CONNECTIONS),
    )
    .await
}

/// Answers one HTTP request: POST an AdmissionReview, get one back; `/healthz` for probes.
pub async fn handle(
    request: Request<Incoming>,
    options: Arc<InjectOptions>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if request.method() == Method::GET && request.uri().path() == "/healthz" {
        return Ok(reply(StatusCode::OK, "text/plain", "ok\n".into()));
    }
    if request.method() != Method::POST {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "POST an AdmissionReview\n".into(),
        ));
    }
    let body = match Limited::new(request.into_body(), MAX_REVIEW_BYTES).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return Ok(reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("unreadable body: {e}\n"),
            ))
        }
    };
    match review(&body, &options) {
        Ok(answer) => Ok(reply(StatusCode::OK, "application/json", answer.to_string())),
        Err(message) => Ok(reply(StatusCode::BAD_REQUEST, "text/plain", format!("{message}\n"))),
    }
}

/// The AdmissionReview response for a request body; `Err` only when it is no AdmissionReview.
pub fn review(body: &[u8], options: &InjectOptions) -> Result<Value, String> {
    let review: Value = serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let request = review.get("request").ok_or("not an AdmissionReview: no request")?;
    let uid = request["uid"]
        .as_str()
        .ok_or("not an AdmissionReview: no request.uid")?;
    let mut response = json!({"uid": uid, "allowed": true});
    let mut warnings: Vec<String> = match request.get("object") {
        Some(pod) if request["kind"]["kind"] == "Pod" => inject::metadata_warnings(pod)
            .into_iter()
            .map(|w| format!("llmslo: {w}"))
            .collect(),
        _ => Vec::new(),
    };
    match mutate(request, options) {
        Ok(Some(patch)) => {
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        Ok(None) => {}
        Err(warning) => {
            tracing::warn!(%warning, "admitted unchanged");
            warnings.push(format!("llmslo: admitted unchanged: {warning}"));
        }
    }
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    Ok(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
}

/// The JSONPatch for the request's Pod, `None` when it is not to be injected.
fn mutate(request: &Value, options: &InjectOptions) -> Result<Option<Value>, String> {
    if request["kind"]["kind"] != "Pod" || request["operation"] != "CREATE" {
        return Ok(None);
    }
    let original = request.get("object").ok_or("the request carries no object")?;
    let mut pod = original.clone();
    if !inject_pod_template(&mut pod, options)? {
        return Ok(None);
    }
    let patch = json_patch::diff(original, &pod);
    Ok(Some(serde_json::to_value(patch).expect("a patch serializes")))
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(object: Value, kind: &str, operation: &str) -> Vec<u8> {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": operation,
                "object": object,
            }
        })
        .to_string()
        .into_bytes()
    }

    fn pod(labelled: bool) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "vllm-7d9f-", "labels": {"app": "vllm", "llmslo.io/inject": if labelled { "true" } else { "no" }}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "ports": [{"name": "http", "containerPort": 8000}]}]}
        })
    }

    fn patch_of(answer: &Value) -> Option<json_patch::Patch> {
        let encoded = answer["response"]["patch"].as_str()?;
        let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
        Some(serde_json::from_slice(&decoded).unwrap())
    }

    #[test]
    fn an_opted_in_pod_gets_a_patch_that_injects_it() {
        let answer = review(
            &admission(pod(true), "Pod", "CREATE"),
            &InjectOptions::with_image("llmslo:test"),
        )
        .unwrap();
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let mut patched = pod(true);
        json_patch::patch(&mut patched, &patch_of(&answer).unwrap()).unwrap();
        let mut expected = pod(true);
        assert!(inject_pod_template(&mut expected, &InjectOptions::with_image("llmslo:test")).unwrap());
        assert_eq!(patched, expected, "applying the patch gives exactly the injected pod");
        assert_eq!(patched["spec"]["initContainers"][0]["name"], "llmslo");
    }

    #[test]
    fn anything_else_is_allowed_unchanged() {
        for body in [
            admission(pod(false), "Pod", "CREATE"),
            admission(pod(true), "Pod", "UPDATE"),
            admission(pod(true), "Deployment", "CREATE"),
        ] {
            let answer = review(&body, &InjectOptions::with_image("llmslo:test")).unwrap();
            assert_eq!(answer["response"]["allowed"], true);
            assert!(answer["response"].get("patch").is_none());
            assert!(answer["response"].get("warnings").is_none());
        }
    }

    #[test]
    fn a_pod_it_cannot_inject_is_allowed_with_a_warning() {
        let mut portless = pod(true);
        portless["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("ports");
        let answer = review(
            &admission(portless, "Pod", "CREATE"),
            &InjectOptions::with_image("llmslo:test"),
        )
        .unwrap();
        assert_eq!(answer["response"]["allowed"], true);
        assert!(answer["response"].get("patch").is_none());
        assert!(answer["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("llmslo.io/engine-port"));
        let answer = review(
            &admission(json!("not a pod"), "Pod", "CREATE"),
            &InjectOptions::with_image("llmslo:test"),
        )
        .unwrap();
        assert_eq!(answer["response"]["allowed"], true);
    }

    #[test]
    fn a_misspelt_annotation_is_returned_as_a_warning_beside_the_patch() {
        let mut typo = pod(true);
        typo["metadata"]["annotations"] = json!({"llmslo.io/slo-config-map": "chat-slos"});
        let answer = review(
            &admission(typo, "Pod", "CREATE"),
            &InjectOptions::with_image("llmslo:test"),
        )
        .unwrap();
        assert!(patch_of(&answer).is_some());
        assert_eq!(
            answer["response"]["warnings"],
            json!(["llmslo: unknown annotation llmslo.io/slo-config-map, ignored \
                    (did you mean llmslo.io/slo-configmap, in metadata.annotations?)"])
        );
    }

    #[test]
    fn a_body_that_is_no_review_is_a_clear_error() {
        assert!(review(b"{", &InjectOptions::with_image("llmslo:test"))
            .unwrap_err()
            .contains("not an AdmissionReview"));
        assert!(review(b"{\"request\":{}}", &InjectOptions::with_image("llmslo:test"))
            .unwrap_err()
            .contains("uid"));
    }
}
