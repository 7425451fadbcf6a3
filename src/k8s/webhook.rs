//! `llmslo webhook`: a MutatingAdmissionWebhook (admission.k8s.io/v1) that injects the
//! sidecar into Pods created with `llmslo.io/inject: "true"`, answering with a JSONPatch.
//! It never fails a Pod: anything it does not understand is allowed unchanged, with a warning.

use crate::k8s::inject::{self, inject_pod_template, InjectOptions};
use crate::serve::tls::{NamedPath, ServerTls, TlsSource};
use base64::Engine as _;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Largest AdmissionReview accepted: a Pod is at most about 1.5 MiB (etcd's object limit).
pub const MAX_REVIEW_BYTES: usize = 3 << 20;
/// Most JSON values an AdmissionReview may hold (counted before anything is built): a Pod of
/// many containers holds a few thousand.
pub const MAX_REVIEW_VALUES: usize = 20_000;
/// Reviews answered at once (their Pod's JSON built and patched), each after its whole body has
/// arrived: with the bodies' budget, these bound the webhook's memory. The others wait their
/// turn up to [`REVIEW_WAIT`].
pub const MAX_REVIEWS_AT_ONCE: usize = 2;
/// Bytes of review bodies held at once, across every caller, charged as they arrive: a caller
/// that trickles holds only what it sent, and no one's turn.
pub const MAX_BUFFERED_REVIEW_BYTES: usize = 16 << 20;
/// Longest a review's body may take to arrive, from its head: the API server sends it at once.
const REVIEW_BODY_TIMEOUT: Duration = Duration::from_secs(3);
/// Longest a review whose body has arrived waits for its turn: the API server gives up sooner.
const REVIEW_WAIT: Duration = Duration::from_secs(10);

/// The webhook's TLS: `--tls-cert` and `--tls-key`, and with `--client-ca` only clients
/// presenting a certificate it signed (the API server's) complete the handshake. Files that
/// change are served to new connections within seconds.
pub fn tls(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerTls>, String> {
    let named = |path: &Path, name: &str| NamedPath {
        path: path.to_path_buf(),
        name: name.to_string(),
    };
    ServerTls::load(
        TlsSource::Files {
            cert: named(cert, "--tls-cert"),
            key: named(key, "--tls-key"),
        },
        client_ca.map(|ca| named(ca, "--client-ca")),
    )
}

/// Connections open at once (the API servers keep a few each).
const WEBHOOK_MAX_CONNECTIONS: usize = 1024;

/// What the webhook answers with: the injection options, the turns of the reviews and the
/// budget of their bodies' bytes.
#[derive(Debug)]
pub struct Webhook {
    options: InjectOptions,
    turns: tokio::sync::Semaphore,
    bytes: tokio::sync::Semaphore,
}

impl Webhook {
    /// A webhook injecting as `options` say.
    pub fn new(options: InjectOptions) -> Self {
        Self {
            options,
            turns: tokio::sync::Semaphore::new(MAX_REVIEWS_AT_ONCE),
            bytes: tokio::sync::Semaphore::new(MAX_BUFFERED_REVIEW_BYTES),
        }
    }
}

/// Serves the webhook over TLS on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, tls: Arc<ServerTls>, options: InjectOptions, shutdown: CancellationToken) {
    let webhook = Arc::new(Webhook::new(options));
    tokio::spawn(tls.clone().keep_current(shutdown.clone()));
    crate::serve::serve_on(
        listener,
        Some(tls),
        move |request, _peer| handle(request, webhook.clone()),
        shutdown,
        Duration::from_secs(10),
        crate::serve::ConnectionLimits::new(WEBHOOK_MAX_CONNECTIONS),
    )
    .await
}

/// Answers one HTTP request: POST an AdmissionReview, get one back; `/healthz` for probes.
/// Each review's body is read under its own deadline, its bytes charged to a shared budget as
/// they come; only then does it take a turn ([`MAX_REVIEWS_AT_ONCE`]) to be answered, so a
/// caller that trickles holds up no one. Each is bounded in bytes and in values before
/// anything is built of it.
pub async fn handle(request: Request<Incoming>, webhook: Arc<Webhook>) -> Result<Response<Full<Bytes>>, Infallible> {
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
    let (body, _bytes) = match read_body(request.into_body(), &webhook.bytes).await {
        Ok(read) => read,
        Err(refusal) => return Ok(refusal),
    };
    let Ok(Ok(_turn)) = tokio::time::timeout(REVIEW_WAIT, webhook.turns.acquire()).await else {
        return Ok(reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "busy: other reviews are being answered\n".into(),
        ));
    };
    if let Err(message) = within_values(&body, MAX_REVIEW_VALUES) {
        return Ok(reply(StatusCode::BAD_REQUEST, "text/plain", format!("{message}\n")));
    }
    match review(&body, &webhook.options) {
        Ok(answer) => Ok(reply(StatusCode::OK, "application/json", answer.to_string())),
        Err(message) => Ok(reply(StatusCode::BAD_REQUEST, "text/plain", format!("{message}\n"))),
    }
}

/// Reads a review's body within [`REVIEW_BODY_TIMEOUT`] and [`MAX_REVIEW_BYTES`], each frame's
/// bytes taken from `budget` as it arrives and held until the review is answered.
async fn read_body(
    mut body: Incoming,
    budget: &tokio::sync::Semaphore,
) -> Result<(Bytes, tokio::sync::SemaphorePermit<'_>), Response<Full<Bytes>>> {
    let deadline = tokio::time::Instant::now() + REVIEW_BODY_TIMEOUT;
    let late = || {
        reply(
            StatusCode::REQUEST_TIMEOUT,
            "text/plain",
            "the body did not arrive in time\n".into(),
        )
    };
    let mut held = budget.try_acquire_many(0).expect("no permits, always there");
    let mut bytes = Vec::new();
    while let Some(frame) = tokio::time::timeout_at(deadline, body.frame())
        .await
        .map_err(|_| late())?
    {
        let frame =
            frame.map_err(|e| reply(StatusCode::BAD_REQUEST, "text/plain", format!("unreadable body: {e}\n")))?;
        let Ok(data) = frame.into_data() else { continue };
        if bytes.len() + data.len() > MAX_REVIEW_BYTES {
            return Err(reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("unreadable body (at most {MAX_REVIEW_BYTES} bytes): length limit exceeded\n"),
            ));
        }
        let charge = u32::try_from(data.len()).expect("a frame within the review's bound");
        let permit = tokio::time::timeout_at(deadline, budget.acquire_many(charge))
            .await
            .map_err(|_| late())?
            .expect("the budget is never closed");
        held.merge(permit);
        bytes.extend_from_slice(&data);
    }
    Ok((Bytes::from(bytes), held))
}

/// Checks that `body` holds at most `limit` JSON values, counting them as it skips them:
/// nothing is built, so a dense array costs its bytes, not a tree.
fn within_values(body: &[u8], limit: usize) -> Result<(), String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    /// Counts the values of what it visits into a shared count, failing past the limit.
    struct Count<'a> {
        seen: &'a std::cell::Cell<usize>,
        limit: usize,
    }
    impl<'de> DeserializeSeed<'de> for Count<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Count<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
            self.one()
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
            self.one()
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
            self.one()
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
            self.one()
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<(), E> {
            self.one()
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
            self.one()
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            self.one()?;
            while seq.next_element_seed(self.again())?.is_some() {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            self.one()?;
            while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
                map.next_value_seed(self.again())?;
            }
            Ok(())
        }
    }
    impl Count<'_> {
        fn again(&self) -> Self {
            Count {
                seen: self.seen,
                limit: self.limit,
            }
        }
        fn one<E: serde::de::Error>(&self) -> Result<(), E> {
            self.seen.set(self.seen.get() + 1);
            if self.seen.get() > self.limit {
                return Err(E::custom(format!("more than {} JSON values", self.limit)));
            }
            Ok(())
        }
    }
    let seen = std::cell::Cell::new(0);
    let mut reader = serde_json::Deserializer::from_slice(body);
    Count { seen: &seen, limit }
        .deserialize(&mut reader)
        .map_err(|e| format!("not an AdmissionReview llmslo answers: {e}"))
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
            .map(|w| format!("llmslo: {}", w.text))
            .collect(),
        _ => Vec::new(),
    };
    match mutate(request, options) {
        Ok(Some((patch, warning))) => {
            warnings.extend(warning.map(|w| format!("llmslo: {w}")));
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

/// The JSONPatch for the request's Pod and what the injection could not measure, `None` when
/// it is not to be injected.
fn mutate(request: &Value, options: &InjectOptions) -> Result<Option<(Value, Option<String>)>, String> {
    if request["kind"]["kind"] != "Pod" || request["operation"] != "CREATE" {
        return Ok(None);
    }
    let original = request.get("object").ok_or("the request carries no object")?;
    let mut pod = original.clone();
    if !inject_pod_template(&mut pod, options)? {
        return Ok(None);
    }
    let patch = json_patch::diff(original, &pod);
    let warning = inject::injected_warning(&pod).map(str::to_string);
    Ok(Some((
        serde_json::to_value(patch).expect("a patch serializes"),
        warning,
    )))
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

    #[test]
    fn values_are_counted_without_building_anything() {
        assert!(within_values(&admission(pod(true), "Pod", "CREATE"), MAX_REVIEW_VALUES).is_ok());
        let dense = format!("{{\"request\":{{\"object\":[{}0]}}}}", "0,".repeat(30_000));
        let error = within_values(dense.as_bytes(), MAX_REVIEW_VALUES).unwrap_err();
        assert!(error.contains("more than 20000 JSON values"), "{error}");
        assert!(within_values(b"{oops", 10).is_err());
        // Nested past the reader's depth limit: an error, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(within_values(deep.as_bytes(), MAX_REVIEW_VALUES).is_err());
    }
}
