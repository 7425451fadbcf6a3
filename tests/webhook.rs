//! The admission webhook over real TLS on 127.0.0.1: AdmissionReview in, JSONPatch out,
//! applied to the Pod it came with.

mod common;

use base64::Engine as _;
use bytes::Bytes;
use common::required_tool;
use common::tls::https;
use http_body_util::Full;
use llmslo::k8s::inject::{inject_pod_template, InjectOptions};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

struct Tls {
    cert_pem: String,
    key_pem: String,
    roots: rustls::RootCertStore,
}

fn self_signed() -> Tls {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    Tls {
        cert_pem: certified.cert.pem(),
        key_pem: certified.key_pair.serialize_pem(),
        roots,
    }
}

async fn post_review(addr: std::net::SocketAddr, roots: rustls::RootCertStore, review: Value) -> (u16, Value) {
    let request = http::Request::post("/mutate?timeout=10s")
        .header("host", "llmslo-injector.llmslo.svc")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(review.to_string())))
        .unwrap();
    let (status, body) = https(addr, &roots, "localhost", request).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "tgi-", "namespace": "llm", "labels": {"llmslo.io/inject": "true"},
                     "annotations": {"llmslo.io/engine": "tgi"}},
        "spec": {"containers": [{"name": "tgi", "image": "ghcr.io/huggingface/text-generation-inference",
                                 "ports": [{"name": "http", "containerPort": 80}]}]}
    })
}

#[tokio::test]
async fn admission_review_over_tls_returns_a_patch_that_injects_the_pod() {
    let tls = self_signed();
    let dir = std::env::temp_dir().join(format!("llmslo-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), &tls.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &tls.key_pem).unwrap();
    let tls_files = Arc::new(llmslo::k8s::webhook::TlsFiles::load(&dir.join("tls.crt"), &dir.join("tls.key")).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(llmslo::k8s::webhook::serve(
        listener,
        tls_files,
        InjectOptions::with_image("llmslo:test"),
        shutdown.clone(),
    ));

    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "b1e8", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                    "namespace": "llm", "object": pod()}
    });
    let (status, answer) = post_review(addr, tls.roots.clone(), review).await;
    assert_eq!(status, 200);
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["response"]["uid"], "b1e8");
    assert_eq!(answer["response"]["allowed"], true);
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut patched = pod();
    json_patch::patch(&mut patched, &patch).unwrap();
    let mut expected = pod();
    inject_pod_template(&mut expected, &InjectOptions::with_image("llmslo:test")).unwrap();
    assert_eq!(patched, expected);
    let sidecar = &patched["spec"]["initContainers"][0];
    assert_eq!(sidecar["args"][2], "http://127.0.0.1:80");
    assert!(sidecar["env"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "LLMSLO_ENGINE", "value": "tgi"})));

    // Something it does not understand is admitted unchanged.
    let odd = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "request": {"uid": "c2", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": {"spec": 7}}});
    let (status, answer) = post_review(addr, tls.roots.clone(), odd).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"], json!({"uid": "c2", "allowed": true}));

    // Plain HTTP to the TLS port gets no answer; the server stays up.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut plain, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut plain, &mut buf).await;
    assert!(!String::from_utf8_lossy(&buf).contains("200 OK"));
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                        "request": {"uid": "d3", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod()}});
    assert_eq!(post_review(addr, tls.roots.clone(), review.clone()).await.0, 200);

    // A renewed certificate (cert-manager rewrites the Secret) is served without a restart;
    // a half-written pair keeps the previous one in service.
    std::fs::write(dir.join("tls.key"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    assert_eq!(post_review(addr, tls.roots.clone(), review.clone()).await.0, 200);
    let renewed = self_signed();
    std::fs::write(dir.join("tls.crt"), &renewed.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &renewed.key_pem).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    for file in ["tls.crt", "tls.key"] {
        std::fs::File::options()
            .write(true)
            .open(dir.join(file))
            .unwrap()
            .set_modified(later)
            .unwrap();
    }
    assert_eq!(post_review(addr, renewed.roots, review.clone()).await.0, 200);
    let probe = http::Request::get("/healthz").body(Full::default()).unwrap();
    assert!(
        https(addr, &tls.roots, "localhost", probe).await.is_err(),
        "the old certificate is gone"
    );

    shutdown.cancel();
    server.await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_certificate_files_exit_64_naming_the_flag() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args([
            "webhook",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            "/nonexistent.crt",
            "--tls-key",
            "/nonexistent.key",
            "--image",
            "llmslo:test",
        ])
        .env_remove("LLMSLO_IMAGE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--tls-cert /nonexistent.crt"));
}

#[test]
fn the_webhook_needs_an_image() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args(["webhook", "--tls-cert", "tls.crt", "--tls-key", "tls.key"])
        .env_remove("LLMSLO_IMAGE")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--image"));
}

/// Real AdmissionReviews (as the API server sends them, defaults filled in) in, the JSONPatch out,
/// applied, and the patched Pod validated against the Kubernetes 1.29 and 1.33 schemas.
#[test]
#[ignore = "needs kubernetes-validate (.ci/k8s/validate.sh installs it); run with cargo test -- --include-ignored"]
fn patched_pods_from_admission_fixtures_are_valid_kubernetes() {
    let Some(validator) = required_tool(
        "kubernetes-validate",
        &["target/ci/tools/venv/bin/kubernetes-validate"],
        ".ci/k8s/validate.sh installs it",
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("llmslo-patched-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (fixture, sidecar_at) in [
        ("vllm-pod.json", "/spec/initContainers/0"),
        ("tgi-pod-classic.json", "/spec/containers/2"),
    ] {
        let body = std::fs::read(format!(
            "{}/tests/fixtures/admission/{fixture}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let review: Value = serde_json::from_slice(&body).unwrap();
        let answer = llmslo::k8s::webhook::review(&body, &InjectOptions::with_image("llmslo:test")).unwrap();
        assert_eq!(answer["response"]["uid"], review["request"]["uid"]);
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().unwrap())
            .unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
        let mut pod = review["request"]["object"].clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        assert_eq!(
            pod.pointer(&format!("{sidecar_at}/name")),
            Some(&json!("llmslo")),
            "{fixture}"
        );

        let file = dir.join(fixture.replace(".json", ".yaml"));
        std::fs::write(&file, serde_yaml::to_string(&pod).unwrap()).unwrap();
        for version in ["1.29.0", "1.33.0"] {
            let output = std::process::Command::new(&validator)
                .args(["--strict", "--quiet", "-k", version])
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{fixture} patched is not a valid Pod for Kubernetes {version}: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}
