//! The admission webhook over real TLS on 127.0.0.1: AdmissionReview in, JSONPatch out,
//! applied to the Pod it came with.

use crate::common;

use crate::common::required_tool;
use crate::common::tls::https;
use base64::Engine as _;
use bytes::Bytes;
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
    let tls_files = llmslo::k8s::webhook::tls(&dir.join("tls.crt"), &dir.join("tls.key"), None).unwrap();
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

    // A renewed certificate (cert-manager rewrites the Secret) is served to new connections
    // within seconds, without a restart; a half-written pair keeps the previous one in service.
    std::fs::write(dir.join("tls.key"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    tokio::time::sleep(llmslo::serve::tls::RELOAD_EVERY + std::time::Duration::from_millis(500)).await;
    assert_eq!(post_review(addr, tls.roots.clone(), review.clone()).await.0, 200);
    let renewed = self_signed();
    std::fs::write(dir.join("tls.crt"), &renewed.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &renewed.key_pem).unwrap();
    let written = std::time::Instant::now();
    let probe = || http::Request::get("/healthz").body(Full::default()).unwrap();
    while https(addr, &renewed.roots, "localhost", probe()).await.is_err() {
        assert!(
            written.elapsed() < std::time::Duration::from_secs(12),
            "renewed within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(post_review(addr, renewed.roots, review.clone()).await.0, 200);
    assert!(
        https(addr, &tls.roots, "localhost", probe()).await.is_err(),
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

/// `llmslo webhook` in its own process on a free loopback port, with the files of `tls` (and
/// `client_ca`); returns the process and its address once it answers.
async fn webhook_process(
    tls: &Tls,
    client_ca: Option<&str>,
) -> (std::process::Child, std::net::SocketAddr, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "llmslo-webhook-proc-{}-{}",
        std::process::id(),
        common::free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), &tls.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &tls.key_pem).unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port()).parse().unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_llmslo"));
    command.args(["webhook", "--listen", &addr.to_string(), "--image", "llmslo:test"]);
    command
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"));
    if let Some(ca) = client_ca {
        std::fs::write(dir.join("client-ca.crt"), ca).unwrap();
        command.arg("--client-ca").arg(dir.join("client-ca.crt"));
    }
    let child = command
        .env_remove("LLMSLO_IMAGE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (child, addr, dir)
}

fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_reviews_cost_bounded_memory_and_the_next_pod_is_still_injected() {
    let tls = self_signed();
    let (mut child, addr, dir) = webhook_process(&tls, None).await;
    let review = |object: Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                           "operation": "CREATE", "namespace": "llm", "object": object}})
    };
    // A dense array of 3 MiB: refused before anything is built.
    let dense = review(json!({"metadata": {"x": vec![0; 1_400_000]}}));
    // A labelled pod within the value bound whose strings fill the body: injected.
    let mut heavy = pod();
    heavy["spec"]["containers"][0]["env"] = json!((0..900)
        .map(|i| json!({"name": format!("E{i}"), "value": "v".repeat(3000)}))
        .collect::<Vec<_>>());
    let heavy = review(heavy);
    assert!(dense.to_string().len() > 2 << 20 && heavy.to_string().len() > 2 << 20);
    let start = peak_rss_bytes(child.id());
    let sent: Vec<_> = (0..16)
        .map(|i| {
            let (roots, body) = (
                tls.roots.clone(),
                if i % 2 == 0 { dense.clone() } else { heavy.clone() },
            );
            tokio::spawn(async move { post_review(addr, roots, body).await })
        })
        .collect();
    let mut answers = Vec::new();
    for request in sent {
        answers.push(request.await.unwrap());
    }
    for (i, (status, answer)) in answers.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(*status, 400, "the dense review");
        } else {
            assert_eq!(*status, 200);
            assert_eq!(answer["response"]["patchType"], "JSONPatch");
        }
    }
    let peak = peak_rss_bytes(child.id());
    eprintln!("webhook RSS {} MiB at start, peak {} MiB", start >> 20, peak >> 20);
    // One review at a time: measured 20 MiB for one such review, 29 to 41 MiB with sixteen
    // waiting (the allocator's timing varies the peak); before the bounds, one 4 MiB review took
    // it past 300 MiB.
    assert!(
        peak < start + (64 << 20),
        "peak {} MiB from {} MiB",
        peak >> 20,
        start >> 20
    );
    let (status, answer) = post_review(addr, tls.roots.clone(), review(pod())).await;
    assert_eq!((status, &answer["response"]["patchType"]), (200, &json!("JSONPatch")));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_that_trickle_their_bodies_hold_up_no_real_review() {
    use tokio::io::AsyncWriteExt;
    let tls = self_signed();
    let (mut child, addr, dir) = webhook_process(&tls, None).await;
    // Four callers, two reviews each, sending a byte every half second of a 4 KiB body.
    let stop = CancellationToken::new();
    let mut tricklers = Vec::new();
    for _ in 0..8 {
        let mut stream = common::tls::connect(addr, &tls.roots, "localhost").await.unwrap();
        let stop = stop.clone();
        tricklers.push(tokio::spawn(async move {
            let head = "POST /mutate HTTP/1.1\r\nhost: llmslo-injector\r\ncontent-type: application/json\r\n\
                        content-length: 4096\r\n\r\n{";
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            while !stop.is_cancelled() {
                if stream.write_all(b" ").await.is_err() || stream.flush().await.is_err() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "llm", "object": pod()}});
    let started = std::time::Instant::now();
    let real: Vec<_> = (0..8)
        .map(|_| {
            let (roots, review) = (tls.roots.clone(), review.clone());
            tokio::spawn(async move { post_review(addr, roots, review).await })
        })
        .collect();
    for answer in real {
        let (status, answer) = answer.await.unwrap();
        assert_eq!((status, &answer["response"]["patchType"]), (200, &json!("JSONPatch")));
    }
    // The API server gives up after the webhook's timeoutSeconds (5 by default).
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(2), "eight reviews took {took:?}");
    stop.cancel();
    for trickler in tricklers {
        trickler.await.unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_callers_it_signed_are_answered() {
    let tls = self_signed();
    let ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut ca = ca;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client_cert = rcgen::CertificateParams::new(vec!["kube-apiserver".to_string()])
        .unwrap()
        .signed_by(&client_key, &ca_cert, &ca_key)
        .unwrap();
    let (mut child, addr, dir) = webhook_process(&tls, Some(&ca_cert.pem())).await;
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "llm", "object": pod()}});
    let ask = |client: Option<(rcgen::Certificate, rcgen::KeyPair)>| {
        let (roots, review) = (tls.roots.clone(), review.clone());
        async move {
            let config =
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots);
            let config = match client {
                Some((cert, key)) => config
                    .with_client_auth_cert(
                        vec![cert.der().clone()],
                        rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
                    )
                    .unwrap(),
                None => config.with_no_client_auth(),
            };
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .ok()?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(connection);
            let request = http::Request::post("/mutate")
                .header("host", "llmslo-injector.llmslo.svc")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(review.to_string())))
                .unwrap();
            Some(sender.send_request(request).await.ok()?.status().as_u16())
        }
    };
    // Anyone else: refused in the handshake (TLS 1.3 tells the client at its first request).
    assert_eq!(ask(None).await, None);
    // The API server, with the certificate the CA signed: answered.
    assert_eq!(ask(Some((client_cert, client_key))).await, Some(200));
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The Pod a Deployment's template makes.
fn pod_of(deployment_yaml: &str) -> Value {
    let deployment: Value = serde_yaml::from_str(deployment_yaml).unwrap();
    let template = &deployment["spec"]["template"];
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]})
}

/// The webhook's answer for `pod`, and the pod with its patch applied.
fn admitted(pod: &Value) -> (Value, Value) {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "e4", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "llm", "object": pod}});
    let answer =
        llmslo::k8s::webhook::review(review.to_string().as_bytes(), &InjectOptions::with_image("llmslo:test")).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    (answer, patched)
}

#[test]
fn the_webhook_injects_todays_pods_as_inject_does_and_says_what_it_cannot_measure() {
    let kserve = pod_of(&std::fs::read_to_string("tests/fixtures/k8s/kserve-llm-pod.yaml").unwrap());
    let decode = "
apiVersion: apps/v1
kind: Deployment
metadata: {name: qwen-decode}
spec:
  template:
    metadata:
      labels: {app: qwen, llm-d.ai/role: decode, llmslo.io/inject: \"true\"}
      annotations: {llmslo.io/prefill-pool: \"qwen-prefill.llm-d.svc.cluster.local:8000\"}
    spec:
      initContainers:
        - name: routing-proxy
          image: ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.9.0
          args: [--port=8000, --model-server-port=8200, --kv-connector=nixlv2, --cert-path=/etc/routing-certs, TO_PREFILL]
          ports: [{containerPort: 8000}]
          volumeMounts: [{name: routing-certs, mountPath: /etc/routing-certs}]
          restartPolicy: Always
      containers:
        - name: vllm
          image: ghcr.io/llm-d/llm-d-cuda:v0.5.0
          args: [--port, \"8200\"]
          ports: [{containerPort: 8200}]
      volumes: [{name: routing-certs, secret: {secretName: qwen-decode-certs}}]
";
    let unverified = pod_of(&decode.replace(
        "TO_PREFILL",
        "--enable-tls=prefiller, --tls-insecure-skip-verify=prefiller",
    ));
    let verified = pod_of(&decode.replace("TO_PREFILL", "--enable-tls=prefiller"));
    let env = |pod: &Value| -> std::collections::BTreeMap<String, String> {
        pod["spec"]["initContainers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
            .collect()
    };
    for pod in [&kserve, &unverified, &verified] {
        let (_, patched) = admitted(pod);
        let mut expected = pod.clone();
        inject_pod_template(&mut expected, &InjectOptions::with_image("llmslo:test")).unwrap();
        assert_eq!(patched, expected, "the same pod as inject makes");
        assert_eq!(patched["spec"]["initContainers"][0]["name"], "llmslo");
    }
    // KServe: llmslo serves the engine's certificate on its port, the engine on HTTPS behind it.
    let (answer, patched) = admitted(&kserve);
    assert!(answer["response"].get("warnings").is_none(), "{answer}");
    let kserve_env = env(&patched);
    assert_eq!(kserve_env["LLMSLO_TLS_CERT_FILE"], "/etc/ssl/certs/tls.crt");
    assert_eq!(
        patched["spec"]["initContainers"][0]["args"][2],
        "https://127.0.0.1:8100"
    );
    // llm-d 0.9, TLS to prefill pods unverified: the relay in TLS.
    let (answer, patched) = admitted(&unverified);
    assert!(answer["response"].get("warnings").is_none(), "{answer}");
    assert_eq!(env(&patched)["LLMSLO_PREFILL_TLS"], "true");
    // Verified: no relay, and the webhook says so to whoever creates the pod, and on the pod.
    let (answer, patched) = admitted(&verified);
    let warnings = answer["response"]["warnings"].to_string();
    assert!(warnings.contains("unmeasured"), "{answer}");
    assert!(!env(&patched).contains_key("LLMSLO_PREFILL_RELAY"));
    assert!(patched["metadata"]["annotations"].to_string().contains("unmeasured"));
}
