//! TLS on both sides of the hop, end to end on 127.0.0.1 with certificates made in the test: a
//! client speaking h2 or HTTP/1.1 by ALPN to llmslo's TLS port, llmslo speaking TLS to an
//! https engine (itself an llmslo with a TLS port in front of the simulator: a real HTTPS
//! server), every stream counted; a certificate rotated under an open stream; a missing
//! file; an engine that cannot be verified refused, one on this host with its own certificate
//! served when told to skip verification.

use crate::common::tls::{self, connect_alpn, TestCa};
use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use llmslo::config::Config;
use llmslo::sidecar::Sidecar;
use std::net::SocketAddr;
use std::time::Duration;

/// A sidecar from `yaml` (its ports on 127.0.0.1:0 unless it names its own, the engine vllm).
async fn sidecar(yaml: &str) -> Sidecar {
    let listen = if yaml.lines().any(|l| l.starts_with("listen:")) {
        ""
    } else {
        "listen: 127.0.0.1:0\n"
    };
    let yaml = format!("{listen}metrics_listen: 127.0.0.1:0\nengine: vllm\nfinal_scrape_grace: 0s\n{yaml}");
    Sidecar::start(&Config::from_yaml(&yaml).unwrap()).await.unwrap()
}

/// An https engine on 127.0.0.1: the simulator behind an llmslo serving `tls` (YAML).
async fn https_engine(tls: &str) -> (Sidecar, tokio_util::sync::CancellationToken) {
    let (engine, stop) = start_engine(timed_engine(5, 2)).await;
    (sidecar(&format!("upstream: http://{engine}\n{tls}")).await, stop)
}

fn chat_request(host: &str, max_tokens: u32) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("https://{host}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body(max_tokens, true, false))))
        .unwrap()
}

/// Streams a chat request over TLS to `addr` with the protocol ALPN picks from `alpn`; returns
/// the protocol agreed, the status and the body.
async fn stream_over_tls(
    addr: SocketAddr,
    roots: &rustls::RootCertStore,
    alpn: &[u8],
    max_tokens: u32,
) -> (Vec<u8>, u16, String) {
    let tls = connect_alpn(addr, roots, &[alpn]).await.unwrap();
    let agreed = tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec();
    let io = TokioIo::new(tls);
    let response = if agreed == b"h2" {
        let (mut sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(connection);
        sender
            .send_request(chat_request("localhost", max_tokens))
            .await
            .unwrap()
    } else {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        sender
            .send_request(chat_request("localhost", max_tokens))
            .await
            .unwrap()
    };
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (agreed, status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_through_tls_on_both_sides_are_served_and_counted() {
    let ca = TestCa::new("tls-both-sides");
    let (engine_cert, engine_key) = ca.issue("engine", 30);
    let (cert, key) = ca.issue("llmslo", 30);
    let (engine, _stop) = https_engine(&format!(
        "tls: {{cert_file: {}, key_file: {}}}\n",
        engine_cert.display(),
        engine_key.display()
    ))
    .await;
    let front = sidecar(&format!(
        "upstream: https://127.0.0.1:{}\nupstream_tls: {{ca_file: {}, server_name: localhost}}\n\
         tls: {{cert_file: {}, key_file: {}}}\nmetrics_tls: true\n",
        engine.proxy_addr.port(),
        ca.ca_file().display(),
        cert.display(),
        key.display()
    ))
    .await;
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (agreed, status, body) = stream_over_tls(front.proxy_addr, &ca.roots(), alpn, 8).await;
        assert_eq!(agreed, alpn, "ALPN agrees on what the client offers");
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    }
    // The metrics port serves TLS with the same certificate; readiness reached the engine over TLS.
    let scrape = |path: &'static str| {
        http::Request::get(format!("https://localhost{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (status, _) = tls::https(front.metrics_addr, &ca.roots(), "localhost", scrape("/readyz"))
        .await
        .unwrap();
    assert_eq!(status, 200, "ready: the engine answers over TLS");
    let (status, page) = tls::https(front.metrics_addr, &ca.roots(), "localhost", scrape("/metrics"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let page = String::from_utf8_lossy(&page);
    assert_eq!(
        sample(&page, "llmslo_requests_total", &[("outcome", "success")]),
        2.0,
        "{page}"
    );
    assert_eq!(sample(&page, "llmslo_output_tokens_total", &[]), 16.0);
    let expiry = sample(&page, "llmslo_tls_cert_expiry_timestamp_seconds", &[]);
    let in_days = (expiry - time::OffsetDateTime::now_utc().unix_timestamp() as f64) / 86_400.0;
    assert!((29.9..30.1).contains(&in_days), "{in_days}");
    assert_eq!(sample(&page, "llmslo_tls_cert_reloads_total", &[]), 0.0);
    // Plain HTTP to a TLS port is no request.
    let plain = raw_exchange(
        front.proxy_addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert!(!plain.contains("200 OK"), "{plain}");
    front.shutdown().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_to_new_connections_while_an_open_stream_goes_on() {
    let ca = TestCa::new("tls-rotation");
    let (cert, key) = ca.issue("llmslo", 30);
    let (engine, _stop) = start_engine(timed_engine(5, 100)).await;
    let front = sidecar(&format!(
        "upstream: http://{engine}\ntls: {{cert_file: {}, key_file: {}}}\n",
        cert.display(),
        key.display()
    ))
    .await;
    let presented = |addr| {
        let roots = ca.roots();
        async move {
            let tls = connect_alpn(addr, &roots, &[b"http/1.1"]).await.unwrap();
            tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
        }
    };
    let before = presented(front.proxy_addr).await;
    // A 3 s stream, open across the rotation.
    let roots = ca.roots();
    let addr = front.proxy_addr;
    let open = tokio::spawn(async move { stream_over_tls(addr, &roots, b"h2", 30).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Rotated as a Secret's volume does it: the new files replace the old in one rename each.
    let (new_cert, new_key) = ca.issue("next", 90);
    std::fs::rename(&new_key, &key).unwrap();
    std::fs::rename(&new_cert, &cert).unwrap();
    let rotated = tokio::time::Instant::now();
    let mut after = presented(front.proxy_addr).await;
    while after == before && rotated.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = presented(front.proxy_addr).await;
    }
    assert_ne!(after, before, "new connections get the new certificate within 10 s");
    let (_, status, body) = open.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "the open stream went on to its end: {body}"
    );
    let page = settled(&front).await;
    assert_eq!(
        sample(&page, "llmslo_tls_cert_reloads_total", &[("result", "success")]),
        1.0
    );
    let in_days = (sample(&page, "llmslo_tls_cert_expiry_timestamp_seconds", &[])
        - time::OffsetDateTime::now_utc().unix_timestamp() as f64)
        / 86_400.0;
    assert!((89.9..90.1).contains(&in_days), "{in_days}");

    // A change that does not load keeps the certificate in force, and says so.
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n").unwrap();
    let broken = tokio::time::Instant::now();
    while sample(
        &settled(&front).await,
        "llmslo_tls_cert_reloads_total",
        &[("result", "failure")],
    ) == 0.0
    {
        assert!(
            broken.elapsed() < Duration::from_secs(12),
            "the failed reload is counted"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(presented(front.proxy_addr).await, after, "still served");
    front.shutdown().await;
}

#[tokio::test]
async fn a_missing_certificate_file_stops_the_start_naming_the_file() {
    let (engine, _stop) = start_engine(timed_engine(5, 2)).await;
    let yaml = format!(
        "upstream: http://{engine}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\n\
         tls: {{cert_file: /nonexistent/tls.crt, key_file: /nonexistent/tls.key}}\n"
    );
    let Err(error) = Sidecar::start(&Config::from_yaml(&yaml).unwrap()).await else {
        panic!("no start without the certificate");
    };
    let error = error.to_string();
    assert!(
        error.starts_with("tls.cert_file /nonexistent/tls.crt: ") && error.contains("No such file"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_cannot_be_verified_is_refused_and_one_on_this_host_may_skip_verification() {
    // The engine makes its own certificate at start, as KServe's and llm-d's do.
    let (engine, _stop) = https_engine("tls: {self_signed: true}\n").await;
    let upstream = format!("upstream: https://127.0.0.1:{}\n", engine.proxy_addr.port());
    let verified = sidecar(&upstream).await;
    let (status, body) = post_collect(verified.proxy_addr, "/v1/chat/completions", chat_body(4, true, false)).await;
    assert_eq!(
        status,
        502,
        "never trusted silently: {}",
        String::from_utf8_lossy(&body)
    );
    let page = settled(&verified).await;
    assert_eq!(
        sample(&page, "llmslo_requests_total", &[("outcome", "connect_error")]),
        1.0,
        "{page}"
    );
    let readyz = raw_exchange(
        verified.metrics_addr,
        b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(3),
    )
    .await;
    assert!(readyz.starts_with("HTTP/1.1 503"), "not ready: {readyz}");
    verified.shutdown().await;

    let skipping = sidecar(&format!("{upstream}upstream_tls: {{insecure_skip_verify: true}}\n")).await;
    let (status, body) = post_collect(skipping.proxy_addr, "/v1/chat/completions", chat_body(4, true, false)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));
    let page = settled(&skipping).await;
    assert_eq!(sample(&page, "llmslo_requests_total", &[("outcome", "success")]), 1.0);
    skipping.shutdown().await;
    engine.shutdown().await;
}

#[test]
fn tls_settings_that_cannot_work_are_refused_at_load() {
    let up = "upstream: https://127.0.0.1:8443\n";
    let relaying = format!("{up}role: decode\nprefill_relay: 127.0.0.1:8299\nprefill_pool: [10.0.0.0/24:8000]\n");
    let error = |yaml: &str| Config::from_yaml(yaml).unwrap_err().to_string();
    for (yaml, key, says) in [
        (
            "upstream: https://vllm.example:8443\nupstream_tls: {insecure_skip_verify: true}\n".to_string(),
            "upstream_tls.insecure_skip_verify",
            "only for an engine on this host",
        ),
        (
            "upstream: http://127.0.0.1:8000\nupstream_tls: {ca_file: /ca.crt}\n".to_string(),
            "upstream_tls",
            "https://",
        ),
        (
            format!("{up}upstream_tls: {{insecure_skip_verify: true, ca_file: /ca.crt}}\n"),
            "upstream_tls.insecure_skip_verify",
            "keep one",
        ),
        (
            format!("{up}tls: {{cert_file: /a.crt}}\n"),
            "tls.key_file",
            "private key",
        ),
        (
            format!("{up}tls: {{self_signed: true, cert_file: /a.crt, key_file: /a.key}}\n"),
            "tls.self_signed",
            "not both",
        ),
        (format!("{up}metrics_tls: true\n"), "metrics_tls", "set tls"),
        (format!("{up}tls: {{cert: /a.crt}}\n"), "tls", "unknown field"),
        (
            format!("{up}prefill_tls: {{enabled: true}}\n"),
            "prefill_tls",
            "set prefill_relay",
        ),
        (
            format!("{relaying}prefill_tls: {{insecure_skip_verify: true, ca_file: /ca.crt}}\n"),
            "prefill_tls.insecure_skip_verify",
            "keep one",
        ),
        (
            format!("{relaying}prefill_tls: {{verify: false}}\n"),
            "prefill_tls",
            "unknown field",
        ),
    ] {
        let error = error(&yaml);
        assert!(error.contains(key) && error.contains(says), "{yaml}: {error}");
    }
    // Printed and read back the same.
    let config = Config::from_yaml(&format!(
        "{up}upstream_tls: {{ca_file: /ca.crt, server_name: vllm}}\ntls: {{cert_file: /a.crt, key_file: /a.key}}\nmetrics_tls: true\n"
    ))
    .unwrap();
    let again = Config::from_yaml(&config.to_yaml()).unwrap();
    assert_eq!(
        (again.tls, again.metrics_tls, again.upstream_tls),
        (config.tls, true, config.upstream_tls)
    );
    // A verification setting turns the relay's TLS on; printed and read back the same.
    for (prefill, skip) in [("{ca_file: /ca.crt}", false), ("{insecure_skip_verify: true}", true)] {
        let config = Config::from_yaml(&format!("{relaying}prefill_tls: {prefill}\n")).unwrap();
        let tls = config.prefill_tls.clone().expect("on");
        assert_eq!(tls.insecure_skip_verify, skip);
        assert_eq!(Config::from_yaml(&config.to_yaml()).unwrap().prefill_tls, Some(tls));
    }
    let off = Config::from_yaml(&format!("{relaying}prefill_tls: {{enabled: false}}\n")).unwrap();
    assert_eq!(off.prefill_tls, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_kserve_pod_serves_its_https_clients_through_llmslo_on_the_ports_inject_wrote() {
    let ca = TestCa::new("tls-kserve");
    // KServe's certificate for the pod: what vLLM served, and llmslo serves now.
    let (cert, key) = ca.issue("tls", 30);
    let port = quiet_port_with_two_above();
    let pod = std::fs::read_to_string("tests/fixtures/k8s/kserve-llm-pod.yaml")
        .unwrap()
        .replace("/etc/ssl/certs/tls.crt", &cert.display().to_string())
        .replace("/etc/ssl/certs/tls.key", &key.display().to_string())
        .replace("/etc/ssl/certs", &ca.dir.display().to_string())
        .replace("8000", &port.to_string());
    let injected =
        llmslo::k8s::inject::inject_yaml(&pod, &llmslo::k8s::inject::InjectOptions::with_image("llmslo:test")).unwrap();
    assert!(injected.warnings.is_empty(), "{:?}", injected.warnings);
    let pod: serde_json::Value = serde_yaml::from_str(&injected.output).unwrap();
    let spec = &pod["spec"]["template"]["spec"];
    let llmslo = InjectedContainer(spec["initContainers"][0].clone());
    let moved: u16 = InjectedContainer(spec["containers"][0].clone())
        .after("--port")
        .parse()
        .unwrap();
    assert_eq!(llmslo.after("--listen"), format!("0.0.0.0:{port}"));
    assert_eq!(llmslo.after("--upstream"), format!("https://127.0.0.1:{moved}"));

    // The engine where inject moved it, on HTTPS with the pod's certificate (an https server:
    // the simulator behind a TLS port).
    let (sim, _stop) = start_engine(timed_engine(5, 2)).await;
    let engine = sidecar(&format!(
        "upstream: http://{sim}\nlisten: 127.0.0.1:{moved}\ntls: {{cert_file: {}, key_file: {}}}\n",
        cert.display(),
        key.display()
    ))
    .await;
    // llmslo as the pod runs it: its arguments and environment, on loopback.
    let front = sidecar(&format!(
        "upstream: {}\nlisten: 127.0.0.1:{port}\ntls: {{cert_file: {}, key_file: {}}}\n\
         upstream_tls: {{insecure_skip_verify: {}}}\n",
        llmslo.after("--upstream"),
        llmslo.env("LLMSLO_TLS_CERT_FILE"),
        llmslo.env("LLMSLO_TLS_KEY_FILE"),
        llmslo.env("LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY"),
    ))
    .await;
    // KServe's clients and probes, on the port they always used, over HTTPS.
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let (_, status, body) = stream_over_tls(addr, &ca.roots(), alpn, 6).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.ends_with("data: [DONE]\n\n"));
    }
    let probe = http::Request::get("https://localhost/health")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let engine_addr: SocketAddr = ([127, 0, 0, 1], moved).into();
    let (status, _) = tls::https(engine_addr, &ca.roots(), "localhost", probe).await.unwrap();
    assert_eq!(status, 200, "the engine's HTTPS probe, where it moved");
    let page = settled(&front).await;
    assert_eq!(
        sample(&page, "llmslo_requests_total", &[("outcome", "success")]),
        2.0,
        "{page}"
    );
    assert_eq!(sample(&page, "llmslo_output_tokens_total", &[]), 12.0);
    front.shutdown().await;
    engine.shutdown().await;
}

/// Streams a chat completion with the `openai` SDK to `base`, trusting `ca` alone; prints
/// the text.
const OPENAI_OVER_TLS: &str = r#"
import ssl, sys, openai
base, ca = sys.argv[1], sys.argv[2]
trusted = ssl.create_default_context(cafile=ca)
client = openai.OpenAI(base_url=base, api_key="x", http_client=openai.DefaultHttpx2Client(verify=trusted))
stream = client.chat.completions.create(model="sim", max_tokens=6, stream=True,
    messages=[{"role": "user", "content": "hello"}])
print("".join(c.choices[0].delta.content or "" for c in stream if c.choices), end="")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_stream_through_tls_verified_on_both_sides_curl_over_h2_and_the_openai_sdk() {
    let ca = TestCa::new("tls-clients");
    let (cert, key) = ca.issue("tls", 30);
    // The engine on HTTPS with a certificate from the same CA: llmslo verifies it (and speaks
    // h2 to it, which its ALPN offers).
    let engine_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine_addr = engine_listener.local_addr().unwrap();
    let named = |path: &std::path::Path| llmslo::serve::tls::NamedPath {
        path: path.to_path_buf(),
        name: "the engine's".into(),
    };
    let engine_tls = llmslo::serve::tls::ServerTls::load(
        llmslo::serve::tls::TlsSource::Files {
            cert: named(&cert),
            key: named(&key),
        },
        None,
    )
    .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(llmslo::tools::simulate::SimEngine::new(timed_engine(5, 2)).serve_on(
        engine_listener,
        Some(engine_tls),
        shutdown.clone(),
    ));
    let front = sidecar(&format!(
        "upstream: https://localhost:{}\ntls: {{cert_file: {}, key_file: {}}}\nupstream_tls: {{ca_file: {}}}\n",
        engine_addr.port(),
        cert.display(),
        key.display(),
        ca.ca_file().display()
    ))
    .await;
    let port = front.proxy_addr.port();
    let body = r#"{"model":"sim","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"hello"}]}"#;
    let mut served = 0.0;
    if let Some(curl) = required_tool("curl", &[], "apt-get install curl") {
        let output = std::process::Command::new(curl)
            .args(["-sS", "-N", "--http2", "--cacert"])
            .arg(ca.ca_file())
            .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
            .args(["-H", "content-type: application/json", "-d", body])
            .args(["-w", "\nhttp_version=%{http_version}"])
            .arg(format!("https://localhost:{port}/v1/chat/completions"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            text.ends_with("data: [DONE]\n\n\nhttp_version=2"),
            "h2 by ALPN, streamed whole: {text}"
        );
        served += 1.0;
    }
    if let Some(python) = required_tool(
        "python-with-openai",
        &["target/ci/tools/venv/bin/python"],
        "bash .ci/k8s/tools.sh installs the openai SDK into target/ci/tools/venv",
    ) {
        let output = std::process::Command::new(python)
            .args(["-c", OPENAI_OVER_TLS, &format!("https://localhost:{port}/v1")])
            .arg(ca.ca_file())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(!output.stdout.is_empty(), "the SDK read the stream's text");
        served += 1.0;
    }
    let page = settled(&front).await;
    assert_eq!(
        sample(&page, "llmslo_requests_total", &[("outcome", "success")]),
        served,
        "{page}"
    );
    assert_eq!(sample(&page, "llmslo_output_tokens_total", &[]), 6.0 * served);
    front.shutdown().await;
    shutdown.cancel();
}
