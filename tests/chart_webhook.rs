//! The Helm chart's injector, run for real: `helm template` renders the chart, the test starts
//! `llmslo` with exactly the rendered Deployment's arguments and the rendered Secret's
//! certificate, and calls it the way the API server would, trusting only the rendered
//! MutatingWebhookConfiguration's caBundle and naming the rendered Service's DNS name.

use crate::common::{free_port, required_tool, tls};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn b64(text: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text.as_str().unwrap())
        .unwrap()
}

/// Kills the injector when the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
#[ignore = "needs helm (.ci/k8s/validate.sh installs it); run with cargo test -- --include-ignored"]
async fn the_rendered_injector_answers_the_api_server_over_the_rendered_certificate() {
    let Some(helm) = required_tool("helm", &["target/ci/tools/helm"], ".ci/k8s/validate.sh installs it") else {
        return;
    };
    let output = Command::new(helm)
        .args(["template", "llmslo", "helm/llmslo", "--namespace", "llmslo"])
        .args(["--set", "image.repository=registry.example.com/llmslo"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rendered = String::from_utf8(output.stdout).unwrap();
    let objects: Vec<Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect();

    let secret = find(&objects, "Secret");
    let webhook = &find(&objects, "MutatingWebhookConfiguration")["webhooks"][0];
    assert_eq!(
        webhook["clientConfig"]["caBundle"], secret["data"]["ca.crt"],
        "the webhook trusts the chart's CA"
    );
    assert_eq!(webhook["failurePolicy"], "Ignore");
    assert_eq!(webhook["sideEffects"], "None");
    assert_eq!(webhook["objectSelector"]["matchLabels"]["llmslo.io/inject"], "true");
    let service = &webhook["clientConfig"]["service"];
    let host = format!(
        "{}.{}.svc",
        service["name"].as_str().unwrap(),
        service["namespace"].as_str().unwrap()
    );

    let dir = std::env::temp_dir().join(format!("llmslo-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), b64(&secret["data"]["tls.crt"])).unwrap();
    std::fs::write(dir.join("tls.key"), b64(&secret["data"]["tls.key"])).unwrap();
    let port = free_port();
    let container = &find(&objects, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            if a.starts_with("--listen=") {
                format!("--listen=127.0.0.1:{port}")
            } else {
                a.replace("/etc/llmslo/tls", dir.to_str().unwrap())
            }
        })
        .collect();
    let image = args
        .iter()
        .find_map(|a| a.strip_prefix("--image="))
        .unwrap()
        .to_string();
    let _injector = Killed(
        Command::new(env!("CARGO_BIN_EXE_llmslo"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&b64(&webhook["clientConfig"]["caBundle"])) {
        roots.add(cert.unwrap()).unwrap();
    }
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let probe = container["readinessProbe"]["httpGet"]["path"].as_str().unwrap();
    let mut ready = false;
    for _ in 0..100 {
        let request = http::Request::get(probe)
            .header("host", &host)
            .body(Full::default())
            .unwrap();
        if let Ok((200, _)) = tls::https(addr, &roots, &host, request).await {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ready,
        "the injector never answered its readiness probe over TLS as {host}"
    );

    let review = std::fs::read(root().join("tests/fixtures/admission/vllm-pod.json")).unwrap();
    let request = http::Request::post(service["path"].as_str().unwrap())
        .header("host", &host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(review)))
        .unwrap();
    let (status, body) = tls::https(addr, &roots, &host, request).await.unwrap();
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["allowed"], true);
    let patch = String::from_utf8(b64(&answer["response"]["patch"])).unwrap();
    assert!(patch.contains(&format!("\"image\":\"{image}\"")), "{patch}");
    assert!(Path::new(&dir).exists());
    std::fs::remove_dir_all(dir).unwrap();
}
