//! Every byte llmslo changes leaves the framing true: a stream the engine (or a router that
//! buffers, as vLLM's own router does) sends with a `Content-Length`, from which llmslo removes
//! the usage chunk it asked for, reaches every client whole, on HTTP/1.1 and h2, as real
//! clients read it (Python's `http.client`, the `openai` SDK).

use crate::common::*;
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use std::net::SocketAddr;
use std::time::Duration;

/// An engine that answers every stream in one sized body (`Content-Length`, not chunked), the
/// usage chunk in it when the request asked for usage.
async fn sized_engine(name: &'static str) -> SocketAddr {
    let (upstream, _) = scripted_upstream_by(move |request| {
        let (with, without) = with_and_without_usage(name);
        let asked = String::from_utf8_lossy(request).contains("\"include_usage\":true");
        let body = if asked { with } else { without };
        let half = body.len() / 2;
        Script {
            head: format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncontent-length: {}",
                body.len()
            ),
            pieces: vec![
                (Duration::from_millis(5), body[..half].to_vec()),
                (Duration::from_millis(5), body[half..].to_vec()),
            ],
            cut_short: false,
            silent: false,
            trailers: String::new(),
        }
    })
    .await;
    upstream
}

/// POSTs `body` to `path` with `client`: the Content-Length it was sent with and the bytes.
async fn sent_with<C>(
    client: &hyper_util::client::legacy::Client<C, Full<Bytes>>,
    url: String,
    body: &str,
) -> (Option<u64>, Bytes)
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let request = Request::post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let length = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (length, response.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test]
async fn a_sized_stream_llmslo_shortens_is_framed_by_what_it_sends_on_both_protocols() {
    for (name, path, body) in [
        (
            "vllm-chat.sse",
            "/v1/chat/completions",
            r#"{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        ),
        (
            "vllm-completions.sse",
            "/v1/completions",
            r#"{"model":"tiny","prompt":"hi","stream":true}"#,
        ),
    ] {
        let engine = sized_engine(name).await;
        let sidecar = start_sidecar(engine, "").await;
        let url = format!("http://{}{path}", sidecar.proxy_addr);
        let (_, without) = with_and_without_usage(name);
        for (protocol, (length, got)) in [
            ("HTTP/1.1", sent_with(&client(), url.clone(), body).await),
            ("h2", sent_with(&h2c_client(), url.clone(), body).await),
        ] {
            assert_eq!(
                got,
                Bytes::from(without.clone()),
                "{name} over {protocol}: every byte, none extra"
            );
            assert!(
                length.is_none_or(|l| l == without.len() as u64),
                "{name} over {protocol}: a length, if any, is the bytes sent: {length:?}"
            );
        }
        // The client asked for usage itself: nothing is cut, and the engine's length stands.
        let asked = body.replacen('{', r#"{"stream_options":{"include_usage":true},"#, 1);
        let (length, got) = sent_with(&client(), url, &asked).await;
        let (with, _) = with_and_without_usage(name);
        assert_eq!((length, got), (Some(with.len() as u64), Bytes::from(with)));
        let m = settled(&sidecar).await;
        assert_eq!(
            sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
            3.0,
            "{name}: every stream measured whole"
        );
        sidecar.shutdown().await;
    }
}

/// The Python interpreter of CI's tools, with the `openai` SDK installed.
fn python_with_openai() -> Option<std::path::PathBuf> {
    required_tool(
        "python-with-openai",
        &["target/ci/tools/venv/bin/python"],
        "bash .ci/k8s/tools.sh installs the openai SDK into target/ci/tools/venv",
    )
}

/// Runs `script` with `python`, the sidecar's address as its argument; its stdout.
async fn python(python: &std::path::Path, script: &str, addr: SocketAddr) -> String {
    let mut command = std::process::Command::new(python);
    command.args(["-c", script, &addr.to_string()]);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script}\n{stderr}");
    String::from_utf8(output.stdout).unwrap()
}

/// Reads a stream with Python's `http.client`, which raises `IncompleteRead` when a body is
/// shorter than its `Content-Length`; prints the bytes it read.
const HTTP_CLIENT: &str = r#"
import http.client, sys
host, port = sys.argv[1].rsplit(":", 1)
body = '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"stream":true}'
for _ in range(3):
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    assert r.status == 200, r.status
    c.close()
sys.stdout.buffer.write(data)
"#;

/// Streams a chat answer with the official `openai` SDK; prints the text it put together.
const OPENAI_SDK: &str = r#"
import sys, openai
client = openai.OpenAI(base_url=f"http://{sys.argv[1]}/v1", api_key="none", max_retries=0, timeout=10)
text = ""
for chunk in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True):
    for choice in chunk.choices:
        text += choice.delta.content or ""
print(text, end="")
"#;

/// The answer's text in the capture.
fn capture_text() -> String {
    String::from_utf8(fixture("vllm-chat.sse"))
        .unwrap()
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<serde_json::Value>(data).ok())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn pythons_http_client_reads_a_shortened_sized_stream_whole() {
    let sidecar = start_sidecar(sized_engine("vllm-chat.sse").await, "").await;
    let read = python(std::path::Path::new("python3"), HTTP_CLIENT, sidecar.proxy_addr).await;
    assert_eq!(read.into_bytes(), with_and_without_usage("vllm-chat.sse").1);
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "success")]), 3.0);
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &[]),
        48.0,
        "N from the usage llmslo asked for"
    );
    sidecar.shutdown().await;
}

#[tokio::test]
#[ignore = "needs the openai SDK (CI installs it with its tools)"]
async fn the_openai_sdk_streams_a_shortened_sized_stream_whole() {
    let Some(interpreter) = python_with_openai() else {
        return;
    };
    let sidecar = start_sidecar(sized_engine("vllm-chat.sse").await, "").await;
    let text = python(&interpreter, OPENAI_SDK, sidecar.proxy_addr).await;
    assert_eq!(text, capture_text());
    assert!(!text.is_empty());
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "success")]), 1.0);
    sidecar.shutdown().await;
}
