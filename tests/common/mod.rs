//! Shared harness for the integration tests: real servers on 127.0.0.1:0.

pub mod process;
pub mod prometheus;
pub mod routing;
pub mod tls;

use bytes::Bytes;
use http::{header, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use llmslo::config::Config;
use llmslo::sidecar::Sidecar;
use llmslo::tools::simulate::{SimEngine, SimOptions};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Starts the simulated engine on 127.0.0.1:0.
pub async fn start_engine(options: SimOptions) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(SimEngine::new(options).serve(listener, shutdown.clone()));
    (addr, shutdown)
}

/// Starts the sidecar in front of `upstream`, with extra YAML config lines (`engine: vllm`
/// unless they set the engine).
pub async fn start_sidecar(upstream: SocketAddr, extra_yaml: &str) -> Sidecar {
    let engine = if extra_yaml.contains("engine:") {
        ""
    } else {
        "engine: vllm\n"
    };
    // No one scrapes a test's sidecar after its drain, unless the test says so.
    let grace = if extra_yaml.contains("final_scrape_grace:") {
        ""
    } else {
        "final_scrape_grace: 0s\n"
    };
    let yaml = format!(
        "upstream: http://{upstream}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\n{engine}{grace}{extra_yaml}"
    );
    Sidecar::start(&Config::from_yaml(&yaml).unwrap()).await.unwrap()
}

/// Waits until `engine: auto` has identified the engine; returns the provider label.
pub async fn identified(sidecar: &Sidecar) -> &'static str {
    for _ in 0..100 {
        if sidecar.recorder.provider() != "unknown" {
            return sidecar.recorder.provider();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the engine was never identified");
}

/// Waits until the sidecar has learned `model` from the engine's model list (its series exist).
pub async fn model_learned(sidecar: &Sidecar, model: &str) {
    let series = format!("model=\"{model}\"");
    for _ in 0..100 {
        if sidecar.metrics.encode().contains(&series) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("`{model}` was never learned from the engine's model list");
}

/// The batching simulator with a 10 ms step plus 0.5 ms per running sequence and no prefill
/// cost: TPOT at C running is 10 + 0.5·C ms, so a 30 ms TPOT SLO has its knee at exactly 40.
pub fn knee_40_engine() -> SimOptions {
    SimOptions {
        batching: Some(llmslo::tools::simulate::batching::BatchingOptions {
            step_base: Duration::from_millis(10),
            step_per_seq: Duration::from_micros(500),
            prefill_per_token: Duration::ZERO,
            max_batch: 256,
            kv_tokens: None,
            step_jitter: 0.0,
        }),
        ..SimOptions::default()
    }
}

/// A fixed-delay engine: `ttft`, `tpot` in milliseconds.
pub fn timed_engine(ttft_ms: u64, tpot_ms: u64) -> SimOptions {
    SimOptions {
        ttft: llmslo::tools::simulate::delay::Delay::Fixed(Duration::from_millis(ttft_ms)),
        tpot: llmslo::tools::simulate::delay::Delay::Fixed(Duration::from_millis(tpot_ms)),
        ..SimOptions::default()
    }
}

/// A plain HTTP/1.1 client (TCP_NODELAY, as real streaming clients set it).
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    client_builder().build(connector())
}

/// An HTTP/2 prior-knowledge (h2c) client.
pub fn h2c_client() -> Client<HttpConnector, Full<Bytes>> {
    client_builder().http2_only(true).build(connector())
}

fn client_builder() -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.pool_timer(TokioTimer::new()).timer(TokioTimer::new());
    builder
}

fn connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector
}

/// A chat request body.
pub fn chat_body(max_tokens: u32, stream: bool, include_usage: bool) -> String {
    let mut body = serde_json::json!({
        "model": "sim",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if include_usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string()
}

/// POSTs `body` to `path` on `addr`.
pub async fn post(addr: SocketAddr, path: &str, body: String) -> Response<Incoming> {
    let request = Request::post(format!("http://{addr}{path}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    client().request(request).await.unwrap()
}

/// POSTs and reads the whole response: status and body.
pub async fn post_collect(addr: SocketAddr, path: &str, body: String) -> (u16, Bytes) {
    let response = post(addr, path, body).await;
    let status = response.status().as_u16();
    (status, response.into_body().collect().await.unwrap().to_bytes())
}

/// The sum of every sample of `name` whose labels include all of `labels`.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, l) = series.split_once('{').unwrap_or((series, ""));
            let matches = n == name && labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")));
            matches.then(|| value.parse::<f64>().unwrap())
        })
        .sum()
}

/// Waits (in virtual or real time) until `llmslo_requests_in_flight` is zero everywhere.
pub async fn settle(sidecar: &Sidecar) {
    for _ in 0..200 {
        if sample(&sidecar.metrics.encode(), "llmslo_requests_in_flight", &[]) == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("requests still in flight:\n{}", sidecar.metrics.encode());
}

/// Waits until nothing is in flight, then returns the sidecar's metrics text.
pub async fn settled(sidecar: &Sidecar) -> String {
    settle(sidecar).await;
    sidecar.metrics.encode()
}

/// Sends SIGTERM to `child` and requires it to exit 0 within 20 seconds.
pub fn terminate(child: &mut std::process::Child) {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM failed");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("did not exit within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(exit.code(), Some(0), "exit status after SIGTERM");
}

/// One scripted response: a raw head, then body pieces written as HTTP chunks after delays.
#[derive(Clone, Debug)]
pub struct Script {
    /// Status line and headers, CRLF-separated, without the blank line.
    pub head: String,
    /// (delay before, bytes) for each chunk.
    pub pieces: Vec<(Duration, Vec<u8>)>,
    /// Close the connection instead of sending the final chunk.
    pub cut_short: bool,
    /// Never answer at all.
    pub silent: bool,
    /// Trailer lines (CRLF-separated) sent with the final chunk, when not empty.
    pub trailers: String,
}

impl Script {
    /// A chunked 200 SSE response made of `pieces`.
    pub fn sse(pieces: Vec<(Duration, Vec<u8>)>) -> Self {
        Self {
            head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked"
                .to_string(),
            pieces,
            cut_short: false,
            silent: false,
            trailers: String::new(),
        }
    }
}

/// The real vLLM chat capture as a script, one event per chunk: the first after `first`,
/// then one every `every`.
pub fn paced_capture(first: Duration, every: Duration) -> Script {
    let text = String::from_utf8(fixture("vllm-chat.sse")).unwrap();
    let pieces = text
        .split_inclusive("\n\n")
        .enumerate()
        .map(|(i, event)| (if i == 0 { first } else { every }, event.as_bytes().to_vec()))
        .collect();
    Script::sse(pieces)
}

/// A raw upstream that answers every request with `script` and keeps every request it got.
pub async fn scripted_upstream(script: Script) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    scripted_upstream_by(move |_| script.clone()).await
}

/// A raw upstream that answers each request (raw bytes in) with the script `choose` picks.
pub async fn scripted_upstream_by(
    choose: impl Fn(&[u8]) -> Script + Send + Sync + 'static,
) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = received.clone();
    let choose = Arc::new(choose);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            // Head and body go out in separate writes: without this, Nagle holds the body back.
            stream.set_nodelay(true).unwrap();
            tokio::spawn(answer(stream, choose.clone(), log.clone()));
        }
    });
    (addr, received)
}

type Chooser = Arc<dyn Fn(&[u8]) -> Script + Send + Sync>;

async fn answer(mut stream: TcpStream, choose: Chooser, log: Arc<Mutex<Vec<Vec<u8>>>>) {
    loop {
        let Some(request) = read_request(&mut stream).await else {
            return;
        };
        let script = choose(&request);
        log.lock().unwrap().push(request);
        if script.silent {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
        let chunked = script.head.to_ascii_lowercase().contains("transfer-encoding: chunked");
        if stream
            .write_all(format!("{}\r\n\r\n", script.head).as_bytes())
            .await
            .is_err()
        {
            return;
        }
        for (delay, piece) in &script.pieces {
            tokio::time::sleep(*delay).await;
            let mut out = Vec::new();
            if chunked {
                out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                out.extend_from_slice(piece);
                out.extend_from_slice(b"\r\n");
            } else {
                out.extend_from_slice(piece);
            }
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
        if script.cut_short {
            return;
        }
        let trailers = if script.trailers.is_empty() {
            String::new()
        } else {
            format!("{}\r\n", script.trailers)
        };
        if chunked
            && stream
                .write_all(format!("0\r\n{trailers}\r\n").as_bytes())
                .await
                .is_err()
        {
            return;
        }
    }
}

/// Reads one HTTP/1.1 request (head and Content-Length body) as raw bytes.
async fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf)
}

/// An upstream that reads each request's whole body before answering 200 with its length
/// (as an engine does): a body that fails on the way fails the exchange.
pub async fn body_reading_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                    let length = request.into_body().collect().await?.to_bytes().len();
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(format!("{{\"read\":{length}}}")))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Sends raw bytes to `addr` and reads until the peer closes or `wait` passes: what came back.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8], wait: Duration) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_for(&mut stream, wait).await
}

/// Reads from `stream` until it closes (or errors) or `wait` passes.
pub async fn read_for(stream: &mut TcpStream, wait: Duration) -> String {
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// The first request the scripted upstream got that starts with `prefix` (skipping health probes).
pub fn request_to(log: &Mutex<Vec<Vec<u8>>>, prefix: &str) -> String {
    let log = log.lock().unwrap();
    let request = log
        .iter()
        .find(|r| r.starts_with(prefix.as_bytes()))
        .expect("no such request");
    String::from_utf8_lossy(request).into_owned()
}

/// Reads a fixture from tests/fixtures.
pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Runs the binary (as [`llmslo_output`]) without blocking the runtime that serves the test's
/// engines.
pub async fn llmslo_output_async(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        llmslo_output(&args)
    })
    .await
    .unwrap()
}

/// Runs the `llmslo` binary in the crate root without the `LLMSLO_*` environment:
/// (exit code, stdout, stderr).
pub fn llmslo_output(args: &[&str]) -> (i32, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_llmslo"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LLMSLO_") {
            command.env_remove(name);
        }
    }
    let output = command
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        output.status.code().unwrap(),
        text(&output.stdout),
        text(&output.stderr),
    )
}

/// An external tool an end-to-end test needs: the first of `candidates` (relative to the crate
/// root) that exists, else `name` on PATH. Such tests are `#[ignore]`d with the tool named, so
/// a plain `cargo test` says how many it left out; `-- --include-ignored` runs them, and a
/// missing tool then skips the test, except under CI (`CI` set), which installs every tool
/// (`install` says how) and must never skip.
pub fn required_tool(name: &str, candidates: &[&str], install: &str) -> Option<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = candidates
        .iter()
        .map(|c| root.join(c))
        .chain(std::env::split_paths(&path).map(|dir| dir.join(name)))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(std::env::var_os("CI").is_none(), "`{name}` is missing: {install}");
        eprintln!("SKIPPED: `{name}` is not installed ({install})");
    }
    found
}

/// A real vLLM capture made with include_usage, and what vLLM sends without it: the same
/// stream less its usage-only event.
pub fn with_and_without_usage(name: &str) -> (Vec<u8>, Vec<u8>) {
    let with = fixture(name);
    let text = String::from_utf8(with.clone()).unwrap();
    let usage_event = text
        .split_inclusive("\n\n")
        .find(|e| e.contains("\"choices\":[],\"usage\""))
        .unwrap();
    (with, text.replace(usage_event, "").into_bytes())
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port below the kernel's ephemeral range, with the ports 100 and 200 above it free too
/// (where inject moves what it puts llmslo in front of): no outgoing connection of a test beside
/// this one can take them.
pub fn quiet_port_with_two_above() -> u16 {
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    let start = 20_000 + (std::process::id() % 5_000) as u16 + (next_offset() % 500);
    let mut ports = (start..32_000).filter(|&p| free(p) && free(p + 100) && free(p + 200));
    ports.next().expect("a free port under 32000")
}

/// A small offset that differs between callers in one process, so that two tests do not
/// race for the same quiet port.
fn next_offset() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    NEXT.fetch_add(7, std::sync::atomic::Ordering::Relaxed)
}

/// An injected pod template's container, as Kubernetes would run it: its args, what follows a
/// flag among them, and its environment.
pub struct InjectedContainer(pub serde_json::Value);

impl InjectedContainer {
    /// Its `args`.
    pub fn args(&self) -> Vec<String> {
        self.0["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    }

    /// The argument after `flag`.
    pub fn after(&self, flag: &str) -> String {
        let args = self.args();
        args[args.iter().position(|a| a == flag).unwrap() + 1].clone()
    }

    /// Environment variable `name`'s value, empty when unset.
    pub fn env(&self, name: &str) -> String {
        self.0["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}
