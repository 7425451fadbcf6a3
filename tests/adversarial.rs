//! Attacks a hostile client can make on a pod, each bounded and on loopback: the sidecar must
//! keep `/metrics` parseable for Prometheus and keep serving everyone else.

use crate::common::*;
use std::io::Write;

/// Checks every line of an exposition against the text format's grammar: a metric name, then
/// optionally `{name="value",...}` with only `\\`, `\"` and `\n` escaped in values, then a value.
fn assert_parses(exposition: &str) {
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let bytes = line.as_bytes();
        let at = |i: usize| *bytes.get(i).unwrap_or_else(|| panic!("line ends early: {line:?}"));
        let mut i = 0;
        while i < bytes.len() && is_name(bytes[i]) {
            i += 1;
        }
        assert!(i > 0 && !bytes[0].is_ascii_digit(), "not a metric name: {line:?}");
        if i < bytes.len() && bytes[i] == b'{' {
            i += 1;
            while at(i) != b'}' {
                let start = i;
                while is_name(at(i)) {
                    i += 1;
                }
                assert!(i > start && at(i) == b'=' && at(i + 1) == b'"', "bad label in {line:?}");
                i += 2;
                loop {
                    match at(i) {
                        b'"' => break,
                        b'\\' => {
                            assert!(matches!(at(i + 1), b'\\' | b'"' | b'n'), "bad escape in {line:?}");
                            i += 2;
                        }
                        _ => i += 1,
                    }
                }
                i += 1;
                if at(i) == b',' {
                    i += 1;
                }
            }
            i += 1;
        }
        let value = line[i..].trim_start().split(' ').next().unwrap_or("");
        assert!(
            value.parse::<f64>().is_ok() || ["NaN", "+Inf", "-Inf"].contains(&value),
            "bad sample value in {line:?}"
        );
    }
}

/// An engine that answers every request with a one-token stream, whatever it asked for.
async fn one_token_upstream() -> (std::net::SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    scripted_upstream(Script::sse(vec![(
        std::time::Duration::ZERO,
        chunk.as_bytes().to_vec(),
    )]))
    .await
}

#[tokio::test]
async fn model_names_that_would_break_the_exposition_are_other() {
    // An engine that answers 200 to any model name (llama.cpp- and TGI-style).
    let (upstream, _) = one_token_upstream().await;
    let sidecar = start_sidecar(upstream, "engine: llamacpp\n").await;
    let hostile = [
        "evil\"} 1\nfake_metric 1",
        "back\\slash",
        "quote\"",
        "brace{x=\"1\"}",
        "line\nbreak",
        "tab\there",
    ];
    for model in hostile.iter().chain(&["meta-llama/Llama-3.1-8B-Instruct"]) {
        let body = serde_json::json!({"model": model, "stream": true, "messages": []}).to_string();
        let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{model:?} is forwarded as it is");
    }
    let m = settled(&sidecar).await;
    assert_parses(&m);
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("model", "other")]),
        hostile.len() as f64,
        "{m}"
    );
    let learned = [("model", "meta-llama/Llama-3.1-8B-Instruct")];
    assert_eq!(
        sample(&m, "llmslo_requests_total", &learned),
        1.0,
        "a real model id is learned"
    );
    if let Some(promtool) = required_tool("promtool", &[], "apt-get install prometheus") {
        // promtool exits 1 on a parse error, 3 on style lints alone (OpenMetrics counters).
        let check = std::process::Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .output_with_stdin(m.as_bytes());
        let said = String::from_utf8_lossy(&check.stderr).into_owned() + &String::from_utf8_lossy(&check.stdout);
        assert!(
            check.status.code() != Some(1) && !said.contains("parsing error"),
            "promtool cannot parse /metrics: {said}"
        );
    }
    sidecar.shutdown().await;
}

/// Runs a command with `input` on its standard input.
trait OutputWithStdin {
    fn output_with_stdin(&mut self, input: &[u8]) -> std::process::Output;
}

impl OutputWithStdin for std::process::Command {
    fn output_with_stdin(&mut self, input: &[u8]) -> std::process::Output {
        let mut child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    }
}

#[test]
fn the_grammar_check_catches_an_unescaped_value() {
    assert_parses("x_total{model=\"a\\\"b\",op=\"c\"} 1\ny 2.5\n");
    let broken = std::panic::catch_unwind(|| assert_parses("x_total{model=\"a\"b\"} 1\n"));
    assert!(broken.is_err(), "a raw quote inside a value is caught");
}

#[tokio::test(start_paused = true)]
async fn a_request_head_that_never_completes_is_closed_at_the_head_timeout() {
    use tokio::io::AsyncWriteExt;
    let (upstream, _) = scripted_upstream(Script::sse(Vec::new())).await;
    let sidecar = start_sidecar(upstream, "").await;
    // (bytes, seconds the connection is held): the start of a request waits out the deadline;
    // bytes that cannot begin one (a TLS handshake on a plain port) are refused at once.
    let partial: [(&[u8], std::ops::RangeInclusive<u64>); 5] = [
        (b"P", 30..=31),
        (b"PRI * HTTP/2.0\r\n", 30..=31),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 30..=31),
        (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n", 30..=31),
        (b"\x16\x03\x01", 0..=1),
    ];
    for (bytes, held) in partial {
        let mut stream = tokio::net::TcpStream::connect(sidecar.proxy_addr).await.unwrap();
        let started = tokio::time::Instant::now();
        stream.write_all(bytes).await.unwrap();
        let answer = read_for(&mut stream, std::time::Duration::from_secs(120)).await;
        let closed_after = started.elapsed().as_secs();
        assert!(
            held.contains(&closed_after),
            "{:?}: closed after {closed_after} s ({answer:?})",
            String::from_utf8_lossy(bytes)
        );
    }
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_proxy_connections_open", &[]), 0.0, "{m}");
    // Everyone else is still served.
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn asking_for_usage_changes_no_other_byte_of_the_request() {
    let (upstream, log) = one_token_upstream().await;
    let sidecar = start_sidecar(upstream, "engine: vllm\n").await;
    let body = r#"{"model":"m","seed":123456789012345678901234567890,"stream":true,"stream_options":{"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}]}"#;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", body.to_string()).await;
    assert_eq!(status, 200);
    let sent = request_to(&log, "POST /v1/chat/completions");
    let expected = body.replace(
        r#""stream_options":{"continuous_usage_stats""#,
        r#""stream_options":{"include_usage":true,"continuous_usage_stats""#,
    );
    assert!(sent.ends_with(&expected), "the engine got:\n{sent}");
    assert!(sent.contains(&format!("content-length: {}", expected.len())));
    sidecar.shutdown().await;
}

#[tokio::test]
async fn the_usage_chunk_llmslo_asked_for_never_reaches_the_client_after_an_oversized_event() {
    let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    let huge = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(300_000)
    );
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3}}\n\n";
    let done = "data: [DONE]\n\n";
    let pieces: Vec<(std::time::Duration, Vec<u8>)> = [token, &huge[..150_000], &huge[150_000..], token, usage, done]
        .iter()
        .map(|p| (std::time::Duration::ZERO, p.as_bytes().to_vec()))
        .collect();
    let (upstream, log) = scripted_upstream(Script::sse(pieces)).await;
    let sidecar = start_sidecar(upstream, "engine: vllm\nmax_event_bytes: 65536\n").await;
    // The client did not ask for usage: llmslo asks on its behalf, and must hide the answer.
    let (status, received) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(3, true, false)).await;
    assert_eq!(status, 200);
    assert!(request_to(&log, "POST /v1/chat/completions").contains("include_usage"));
    let expected = [token, &huge, token, done].concat();
    assert_eq!(received.len(), expected.len());
    assert!(
        received == expected.as_bytes(),
        "the client gets what the engine sent, less the usage chunk"
    );
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(
            &m,
            "llmslo_unmeasured_responses_total",
            &[("reason", "oversized_event")]
        ),
        1.0
    );
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "success")]), 1.0);
    sidecar.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn upload_time_is_the_clients_not_the_engines() {
    use tokio::io::AsyncWriteExt;
    let upstream = body_reading_upstream().await;
    // A body over max_peek_bytes streams to the engine as it arrives.
    let config = "upstream_timeout: 1s\nrequest_body_timeout: 2s\nrequest_body_min_rate: 1\nmax_peek_bytes: 16\n";
    let sidecar = start_sidecar(upstream, config).await;
    // A 3 s upload, steady, against a 1 s response deadline: the engine answers at once after it.
    let body = format!("{{\"model\":\"m\",\"pad\":\"{}\"}}", " ".repeat(28));
    let mut stream = tokio::net::TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for piece in body.as_bytes().chunks(10) {
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        stream.write_all(piece).await.unwrap();
    }
    let answer = read_for(&mut stream, std::time::Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
        1.0,
        "{m}"
    );
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "timeout")]), 0.0);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_is_cut_off_after_the_send_timeout() {
    use tokio::io::AsyncWriteExt;
    let event = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(60_000)
    );
    let pieces = (0..400)
        .map(|_| (std::time::Duration::ZERO, event.as_bytes().to_vec()))
        .collect();
    let (upstream, _) = scripted_upstream(Script::sse(pieces)).await;
    let sidecar = start_sidecar(upstream, &format!("send_timeout: 2s\n{}", "inject_usage: false\n")).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(sidecar.proxy_addr).await.unwrap();
    let body = chat_body(10, true, false);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // Never read: the sidecar's writes back up, and after 2 s it gives up on this client.
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let m = settled(&sidecar).await;
    let cancelled = [("outcome", "client_cancelled")];
    assert_eq!(sample(&m, "llmslo_requests_total", &cancelled), 1.0, "{m}");
    assert_eq!(sample(&m, "llmslo_proxy_connections_open", &[]), 0.0);
    drop(stream);
    // Everyone else is still served.
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
}

/// Opens a generation upload that declares `length` bytes and sends `sent` of them.
async fn slow_upload(addr: std::net::SocketAddr, length: usize, sent: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n{}",
        " ".repeat(sent)
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_that_declare_the_whole_budget_lock_out_no_one() {
    let (upstream, _) = start_engine(Default::default()).await;
    // Four uploads declare 4 MiB each (max_peek_bytes), the whole 16 MiB budget, and trickle.
    let sidecar = start_sidecar(upstream, "max_buffered_request_bytes: 16777216\n").await;
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(slow_upload(sidecar.proxy_addr, 4 << 20, 1).await);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for _ in 0..20 {
        let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(4, true, false)).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    let m = sidecar.metrics.encode();
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_refused_total",
            &[("reason", "request_buffer_full")]
        ),
        0.0
    );
    drop(slow);
    sidecar.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_upload_that_trickles_is_cut_off_at_the_total_body_timeout() {
    use tokio::io::AsyncWriteExt;
    let upstream = body_reading_upstream().await;
    let config = "request_body_timeout: 30s\nrequest_body_total_timeout: 2m\nrequest_body_min_rate: 0\n";
    let sidecar = start_sidecar(upstream, config).await;
    let mut stream = slow_upload(sidecar.proxy_addr, 4_000, 1).await;
    // One byte every 20 s never trips the 30 s gap, but the whole body is due within 2 min.
    let mut answer = String::new();
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_secs(20)).await;
        if stream.write_all(b" ").await.is_err() {
            break;
        }
        answer = read_for(&mut stream, std::time::Duration::from_millis(10)).await;
        if !answer.is_empty() {
            break;
        }
    }
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("longer than 2m"), "{answer}");
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "client_error")]),
        1.0,
        "{m}"
    );
    // Everyone else is still served.
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_in_flight_cap_get_503_and_are_no_ones_fault() {
    let (upstream, _) = start_engine(timed_engine(50, 100)).await;
    let sidecar = start_sidecar(upstream, "max_in_flight_requests: 3\nmax_in_flight_per_client: 3\n").await;
    let addr = sidecar.proxy_addr;
    let streams: Vec<_> = (0..6)
        .map(|_| {
            tokio::spawn(async move { post_collect(addr, "/v1/chat/completions", chat_body(10, true, false)).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for s in streams {
        statuses.push(s.await.unwrap().0);
    }
    statuses.sort();
    assert_eq!(statuses, [200, 200, 200, 503, 503, 503]);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_refused_total", &[("reason", "in_flight_limit")]),
        3.0
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
        3.0,
        "{m}"
    );
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "client_error")]), 0.0);
    // The cap frees as streams end.
    let (status, _) = post_collect(addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_file_descriptors_is_the_sidecars_exhaustion_not_the_engines_fault() {
    let (upstream, _) = start_engine(timed_engine(20, 20)).await;
    // A low open-file limit: 60 streams need about 120 descriptors.
    let sidecar = process::SidecarProcess::start(upstream, "max_connections: 1000\n", Some(64));
    let baseline = sidecar.open_fds();
    let addr = sidecar.proxy;
    let streams: Vec<_> = (0..60)
        .map(|_| {
            tokio::spawn(async move {
                let sent = post(addr, "/v1/chat/completions", chat_body(50, true, false));
                match tokio::time::timeout(std::time::Duration::from_secs(20), sent).await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let _ = http_body_util::BodyExt::collect(response.into_body()).await;
                        status
                    }
                    Err(_) => 0,
                }
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for s in streams {
        statuses.push(s.await.unwrap());
    }
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(statuses.iter().all(|s| [200, 503].contains(s)), "{statuses:?}");
    let m = sidecar.scrape().await;
    assert!(
        sample(&m, "llmslo_requests_refused_total", &[("reason", "file_descriptors")]) > 0.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "connect_error")]),
        0.0,
        "{m}"
    );
    assert_eq!(sidecar.healthz().await, 200);
    // Everyone else is served again, and the descriptors came back.
    let (status, _) = post_collect(addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
    eprintln!("fds: {baseline} at the start, {} after", sidecar.open_fds());
    sidecar.stop();
}

/// The memory limit the chart and the injector give the sidecar container.
const MEMORY_LIMIT: u64 = 128 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long proof (35 s: every attack in turn against the running binary): CI runs it with --include-ignored"]
async fn every_attack_leaves_the_sidecar_serving_within_its_memory_budget() {
    use llmslo::tools::bench::attacks::Attack;
    let (upstream, _) = start_engine(timed_engine(5, 5)).await;
    let sidecar = process::SidecarProcess::start(upstream, "", None);
    // Legitimate streams throughout.
    let stop = tokio_util::sync::CancellationToken::new();
    let legit: Vec<_> = (0..8)
        .map(|_| {
            let (addr, stop) = (sidecar.proxy, stop.clone());
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.is_cancelled() {
                    let (status, body) = post_collect(addr, "/v1/chat/completions", chat_body(8, true, false)).await;
                    if status == 200 && body.ends_with(b"data: [DONE]\n\n") {
                        ok += 1;
                    } else {
                        failed.push(format!("{status} {}", String::from_utf8_lossy(&body)));
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    for attack in Attack::ALL {
        attack.run(sidecar.proxy).await;
        let rss = sidecar.rss_bytes();
        eprintln!(
            "after {:<26} RSS {:>5.1} MiB (peak {:>5.1}), {} fds",
            attack.name(),
            rss as f64 / 1048576.0,
            sidecar.peak_rss_bytes() as f64 / 1048576.0,
            sidecar.open_fds()
        );
        assert_eq!(sidecar.healthz().await, 200, "/healthz after {}", attack.name());
        assert_parses(&sidecar.scrape().await);
    }
    stop.cancel();
    for task in legit {
        let (ok, failed) = task.await.unwrap();
        assert!(
            ok > 0 && failed.is_empty(),
            "{ok} legitimate streams succeeded, these failed: {failed:?}"
        );
    }
    assert!(
        sidecar.peak_rss_bytes() < MEMORY_LIMIT,
        "peak RSS {} MiB",
        sidecar.peak_rss_bytes() >> 20
    );
    // Every attacking connection is gone once the attacker went away.
    let mut open = f64::NAN;
    for _ in 0..100 {
        open = sample(&sidecar.scrape().await, "llmslo_proxy_connections_open", &[]);
        if open == 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(open, 0.0, "client connections still open");
    let m = sidecar.scrape().await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "upstream_error")]),
        0.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "connect_error")]),
        0.0,
        "{m}"
    );
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_metrics_port_still_answers_the_liveness_probe() {
    use tokio::io::AsyncWriteExt;
    let (upstream, _) = start_engine(Default::default()).await;
    let sidecar = start_sidecar(upstream, "").await;
    // Fill the metrics port's 256 connections with half-sent heads.
    let mut held = Vec::new();
    for _ in 0..300 {
        let mut stream = tokio::net::TcpStream::connect(sidecar.metrics_addr).await.unwrap();
        stream.write_all(b"GET /metr").await.unwrap();
        held.push(stream);
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let probe = raw_exchange(
        sidecar.metrics_addr,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
        std::time::Duration::from_secs(2),
    )
    .await;
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
    let scrape = raw_exchange(
        sidecar.metrics_addr,
        b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n",
        std::time::Duration::from_secs(2),
    )
    .await;
    assert!(scrape.starts_with("HTTP/1.1 503"), "{scrape}");
    drop(held);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_parses(&sidecar.metrics.encode());
    let uri = format!("http://{}/metrics", sidecar.metrics_addr).parse().unwrap();
    assert_eq!(client().get(uri).await.unwrap().status(), 200);
    sidecar.shutdown().await;
}

#[tokio::test]
async fn h2c_connections_are_told_their_stream_limit_in_settings() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (upstream, _) = start_engine(Default::default()).await;
    let sidecar = start_sidecar(upstream, "max_streams_per_connection: 7\n").await;
    let mut stream = tokio::net::TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    // The server's first frame is its SETTINGS: 6-byte entries of id and value.
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 0x4, "a SETTINGS frame");
    let mut payload = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    stream.read_exact(&mut payload).await.unwrap();
    let settings: Vec<(u16, u32)> = payload
        .chunks(6)
        .map(|e| {
            (
                u16::from_be_bytes([e[0], e[1]]),
                u32::from_be_bytes([e[2], e[3], e[4], e[5]]),
            )
        })
        .collect();
    assert!(
        settings.contains(&(0x3, 7)),
        "SETTINGS_MAX_CONCURRENT_STREAMS in {settings:?}"
    );
    // Gone before the drain, which would otherwise wait for this idle connection to time out.
    drop(stream);
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn h2c_stream_multiplication_is_held_to_the_in_flight_cap_in_fds_and_memory() {
    use llmslo::tools::bench::attacks::Attack;
    let (upstream, _) = start_engine(timed_engine(20, 100)).await;
    // Streams of 5 s: every one the attack opens is still streaming when the next comes.
    let config = "max_in_flight_requests: 20\nmax_in_flight_per_client: 20\nmax_streams_per_connection: 10\n";
    let sidecar = process::SidecarProcess::start(upstream, config, None);
    let baseline = sidecar.open_fds();
    // Five h2c connections that each try 150 streams: 10 each are let in (50), 20 forwarded (a margin should a connection be torn down early).
    let attack = tokio::spawn(Attack::StreamMultiplication.run(sidecar.proxy));
    let mut most = 0;
    while !attack.is_finished() {
        most = most.max(sidecar.open_fds());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Client connections, plus one engine connection per request in flight, plus the pool's
    // idle ones (never more than the cap), plus the health probe's.
    let budget = baseline + 5 + 2 * 20 + 1;
    assert!(most <= budget, "{most} fds open at most, budget {budget}");
    let m = sidecar.scrape().await;
    assert!(
        sample(&m, "llmslo_requests_refused_total", &[("reason", "in_flight_limit")]) > 0.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "connect_error")]),
        0.0
    );
    assert!(sidecar.peak_rss_bytes() < MEMORY_LIMIT);
    let (status, _) = post_collect(sidecar.proxy, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
    eprintln!("fds: {baseline} before, {most} at most (budget {budget})");
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_of_half_open_heads_cost_what_the_memory_budget_says() {
    use llmslo::config::memory::PER_CONNECTION_BYTES;
    use tokio::io::AsyncWriteExt;
    let (upstream, _) = start_engine(Default::default()).await;
    let sidecar = process::SidecarProcess::start(upstream, "max_connections: 2048\n", None);
    let before = sidecar.rss_bytes();
    let mut held = Vec::new();
    for _ in 0..2048 {
        let mut stream = tokio::net::TcpStream::connect(sidecar.proxy).await.unwrap();
        stream
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
            .await
            .unwrap();
        held.push(stream);
    }
    // One more is over the cap.
    let refused = raw_exchange(
        sidecar.proxy,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
        std::time::Duration::from_secs(2),
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let grown = sidecar.rss_bytes().saturating_sub(before);
    eprintln!(
        "2048 half-open connections: RSS grew {:.1} KiB each",
        grown as f64 / 2048.0 / 1024.0
    );
    assert!(
        grown < 2048 * PER_CONNECTION_BYTES,
        "grew {} KiB per connection",
        (grown / 2048) >> 10
    );
    assert_eq!(sidecar.healthz().await, 200);
    drop(held);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, _) = post_collect(sidecar.proxy, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legitimate_requests_under_a_small_in_flight_cap_succeed_beside_a_rapid_reset() {
    // hyper answers a rapid reset with GOAWAY after 20 pending-accept resets, so few reset
    // streams ever reach the guard; the in-flight permit is also taken only on a stream's
    // first poll, so those that do never hold one for long.
    use llmslo::tools::bench::attacks::Attack;
    let (upstream, _) = start_engine(timed_engine(5, 5)).await;
    let sidecar = start_sidecar(upstream, "max_in_flight_requests: 20\n").await;
    let addr = sidecar.proxy_addr;
    let attack = tokio::spawn(Attack::RapidReset.run(addr));
    let mut statuses = Vec::new();
    while !attack.is_finished() {
        statuses.push(
            post_collect(addr, "/v1/chat/completions", chat_body(2, true, false))
                .await
                .0,
        );
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let m = sidecar.metrics.encode();
    assert_eq!(
        sample(&m, "llmslo_requests_refused_total", &[("reason", "in_flight_limit")]),
        0.0
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_part_way_through_the_preface_frees_its_slot_at_once() {
    use tokio::io::AsyncWriteExt;
    let (upstream, _) = start_engine(Default::default()).await;
    let sidecar = start_sidecar(upstream, "").await;
    for _ in 0..20 {
        // Too few bytes to tell the h2c preface from a POST or PUT: the sniff waits for more.
        let mut stream = tokio::net::TcpStream::connect(sidecar.proxy_addr).await.unwrap();
        stream.write_all(b"PR").await.unwrap();
    }
    let mut open = f64::NAN;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        open = sample(&sidecar.metrics.encode(), "llmslo_proxy_connections_open", &[]);
        if open == 0.0 {
            break;
        }
    }
    assert_eq!(open, 0.0, "slots still held, not released until the 30 s head deadline");
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_bodies_of_unknown_length_hold_only_their_bytes_of_the_budget() {
    use llmslo::tools::bench::attacks::Attack;
    let (upstream, _) = start_engine(timed_engine(5, 5)).await;
    // h2c bodies carry no Content-Length: 500 at once, 4 MiB of buffer budget.
    let sidecar = start_sidecar(upstream, "max_buffered_request_bytes: 4194304\n").await;
    Attack::StreamMultiplication.run(sidecar.proxy_addr).await;
    let m = sidecar.metrics.encode();
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_refused_total",
            &[("reason", "request_buffer_full")]
        ),
        0.0
    );
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
    sidecar.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Slots held without progress: each is released by a deadline that only progress renews.
// ---------------------------------------------------------------------------------------------

/// Posts a short chat request on a fresh connection until one is answered 200; returns how
/// long that took.
async fn served_within(addr: std::net::SocketAddr, limit: std::time::Duration) -> std::time::Duration {
    let start = std::time::Instant::now();
    let body = chat_body(1, false, false);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    loop {
        let answer = raw_exchange(addr, request.as_bytes(), std::time::Duration::from_secs(2)).await;
        if answer.starts_with("HTTP/1.1 200") {
            return start.elapsed();
        }
        let status = answer.lines().next().unwrap_or("").to_string();
        assert!(start.elapsed() < limit, "no 200 within {limit:?} (last: {status})");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_whose_window_stays_shut_are_released_at_the_send_timeout() {
    use llmslo::tools::bench::attacks::zero_window;
    use std::time::Duration;
    let (upstream, _) = start_engine(timed_engine(10, 100)).await;
    let sidecar = start_sidecar(
        upstream,
        "max_in_flight_requests: 8\nmax_in_flight_per_client: 8\nsend_timeout: 2s\n",
    )
    .await;
    // One connection, eight streaming requests, every stream's window shut for 10 s.
    let attack = tokio::spawn(zero_window(sidecar.proxy_addr, 1, 8, Duration::from_secs(10)));
    let held = async {
        while sample(&sidecar.metrics.encode(), "llmslo_requests_in_flight", &[]) < 8.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), held).await.is_err() {
        panic!("the attack holds every slot:\n{}", sidecar.metrics.encode());
    }
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 503, "every slot is held");
    // The send timeout frees them, and the connection, whose client reads nothing, is closed:
    // long before the attacker would have let go.
    served_within(sidecar.proxy_addr, Duration::from_secs(5)).await;
    tokio::time::timeout(Duration::from_secs(5), attack)
        .await
        .expect("the sidecar closed the attacker's connection")
        .unwrap();
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_client_timeouts_total", &[("timeout", "send_timeout")]),
        8.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "client_cancelled")]),
        8.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "upstream_error")]),
        0.0,
        "{m}"
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_h2c_connections_are_closed_at_the_idle_timeout() {
    use llmslo::tools::bench::attacks::idle_h2;
    use std::time::Duration;
    let (upstream, _) = start_engine(Default::default()).await;
    let sidecar = start_sidecar(upstream, "max_connections: 6\nconnection_idle_timeout: 1s\n").await;
    // Six h2c connections, one request each, then idle for 10 s: every connection slot.
    let attack = tokio::spawn(idle_h2(sidecar.proxy_addr, 6, Duration::from_secs(10)));
    let full = async {
        while sample(&sidecar.metrics.encode(), "llmslo_proxy_connections_open", &[]) < 6.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), full)
        .await
        .expect("the attack holds every connection");
    // A new client is served within seconds, not after the attacker's 10 s.
    served_within(sidecar.proxy_addr, Duration::from_secs(4)).await;
    // The attacker's reads end because the sidecar closed every one of its connections.
    tokio::time::timeout(Duration::from_secs(3), attack)
        .await
        .expect("the idle connections were closed before the attacker let go")
        .unwrap();
    let m = sidecar.metrics.encode();
    assert!(
        sample(
            &m,
            "llmslo_client_timeouts_total",
            &[("timeout", "connection_idle_timeout")]
        ) >= 6.0,
        "{m}"
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_bodies_hold_no_in_flight_slot_and_fall_below_the_minimum_rate() {
    use llmslo::tools::bench::attacks::trickled_bodies;
    use std::time::Duration;
    let (upstream, _) = start_engine(Default::default()).await;
    let config = "max_in_flight_requests: 4\nrequest_body_timeout: 2s\nrequest_body_min_rate: 1024\n";
    let sidecar = start_sidecar(upstream, config).await;
    // Twelve uploads of a byte a second: three times the in-flight cap.
    let attack = tokio::spawn(trickled_bodies(sidecar.proxy_addr, 12, Duration::from_secs(6)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..10 {
        let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(2, true, false)).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    // 2 s of grace, then the average rate is far below 1 KiB/s: each upload is answered 408.
    attack.await.unwrap();
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(
            &m,
            "llmslo_client_timeouts_total",
            &[("timeout", "request_body_min_rate")]
        ),
        12.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "client_error")]),
        12.0,
        "{m}"
    );
    assert_eq!(sample(&m, "llmslo_requests_refused_total", &[]), 0.0, "{m}");
    sidecar.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_upload_below_the_minimum_rate_is_answered_408_with_the_rate() {
    use tokio::io::AsyncWriteExt;
    let upstream = body_reading_upstream().await;
    let sidecar = start_sidecar(upstream, "request_body_timeout: 30s\nrequest_body_min_rate: 100\n").await;
    let mut stream = slow_upload(sidecar.proxy_addr, 4_000, 1).await;
    // One byte every 20 s: within the 30 s gap, far below 100 bytes a second once 30 s pass.
    let mut answer = String::new();
    for _ in 0..5 {
        tokio::time::sleep(std::time::Duration::from_secs(20)).await;
        let _ = stream.write_all(b" ").await;
        answer = read_for(&mut stream, std::time::Duration::from_millis(10)).await;
        if !answer.is_empty() {
            break;
        }
    }
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("slower than 100 bytes per second"), "{answer}");
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
    assert_eq!(status, 200);
}

// ---------------------------------------------------------------------------------------------
// The engine's page is hostile input.
// ---------------------------------------------------------------------------------------------

/// An engine that streams one token for every request and serves `page` on `/metrics`.
async fn engine_with_page(page: String) -> std::net::SocketAddr {
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    let (addr, _) = scripted_upstream_by(move |request| {
        if request.starts_with(b"GET /metrics") {
            Script {
                head: format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}",
                    page.len()
                ),
                pieces: vec![(std::time::Duration::ZERO, page.as_bytes().to_vec())],
                cut_short: false,
                silent: false,
                trailers: String::new(),
            }
        } else {
            Script::sse(vec![(std::time::Duration::ZERO, chunk.as_bytes().to_vec())])
        }
    })
    .await;
    addr
}

/// Waits until the sidecar has read the engine's page once.
async fn page_read(sidecar: &llmslo::sidecar::Sidecar) -> String {
    for _ in 0..300 {
        let m = sidecar.metrics.encode();
        if sample(&m, "llmslo_engine_scrape_up", &[]) == 1.0 {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the engine's page was never read:\n{}", sidecar.metrics.encode());
}

const MALFORMED_LINES: [&str; 7] = [
    "vllm:bad_unquoted{model_name=tiny} 1",
    "vllm:bad_twice{a=\"1\",a=\"2\"} 1",
    "vllm:bad_label{1a=\"1\"} 1",
    "9vllm:bad_digit 1",
    "vllm:bad_escape{a=\"\\q\"} 1",
    "vllm:bad_value{a=\"1\"} one",
    "vllm:bad_open{a=\"1\" 1",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_engine_lines_are_dropped_and_counted_never_merged() {
    let page = format!(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{model_name=\"tiny\"}} 2\n\
         # TYPE vllm:trailing gauge\nvllm:trailing{{a=\"1\",}} 3\n{}\n",
        MALFORMED_LINES.join("\n")
    );
    let upstream = engine_with_page(page).await;
    let sidecar = start_sidecar(upstream, "engine_metrics: merge\nengine_metrics_interval: 1s\n").await;
    let m = page_read(&sidecar).await;
    assert_parses(&m);
    assert!(!m.contains("bad_"), "no bad line is copied:\n{m}");
    assert!(m.contains("vllm:num_requests_waiting{model_name=\"tiny\"} 2.0"), "{m}");
    assert!(
        m.contains("vllm:trailing{a=\"1\"} 3.0"),
        "written again without its comma:\n{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_engine_page_samples_dropped", &[("reason", "malformed")]),
        MALFORMED_LINES.len() as f64
    );
    assert_eq!(sample(&m, "llmslo_engine_requests_waiting", &[]), 2.0);
    // The protobuf exposition carries the same families.
    let proto = sidecar.metrics.encode_protobuf();
    assert!(!String::from_utf8_lossy(&proto).contains("bad_"));
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_cannot_write_series_under_llmslos_names() {
    let page = "# TYPE llmslo_slo_bad_events counter\nllmslo_slo_bad_events_total{slo=\"availability\",model=\"m\",extra=\"x\"} 999\n\
                gen_ai_server_time_to_first_token_seconds_bucket{le=\"1\",x=\"y\"} 5\n\
                # TYPE process_cpu_seconds counter\nprocess_cpu_seconds_total 7\n\
                # TYPE llmslo_requests_refused_bucket gauge\nllmslo_requests_refused_bucket 1\n\
                # TYPE vllm:ok gauge\nvllm:ok 1\n"
        .to_string();
    let upstream = engine_with_page(page).await;
    let sidecar = start_sidecar(upstream, "engine_metrics: merge\nengine_metrics_interval: 1s\n").await;
    let m = page_read(&sidecar).await;
    assert!(m.contains("vllm:ok 1.0"), "{m}");
    assert!(
        !m.contains("extra=\"x\"") && !m.contains("x=\"y\"") && !m.contains(" 999"),
        "{m}"
    );
    assert!(!m.contains("llmslo_requests_refused_bucket"), "{m}");
    assert_eq!(sample(&m, "llmslo_slo_bad_events_total", &[("extra", "x")]), 0.0);
    assert_eq!(
        sample(&m, "llmslo_engine_page_samples_dropped", &[("reason", "reserved_name")]),
        3.0,
        "{m}"
    );
    let own_process = m
        .lines()
        .filter(|l| l.starts_with("# TYPE process_cpu_seconds "))
        .count();
    assert!(own_process <= 1, "one process_cpu_seconds family at most:\n{m}");
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_engine_figures_never_reach_llmslos_series() {
    let page = "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total -5\n\
                # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 1e308\n\
                vllm:num_requests_waiting{engine=\"1\"} 1e308\n\
                # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
        .to_string();
    let upstream = engine_with_page(page).await;
    let sidecar = start_sidecar(upstream, "engine_metrics: merge\nengine_metrics_interval: 1s\n").await;
    let m = page_read(&sidecar).await;
    assert_parses(&m);
    assert!(!m.contains("-5"), "no negative counter:\n{m}");
    assert!(!m.contains("llmslo_engine_preemptions_total"), "{m}");
    assert!(
        !m.contains("llmslo_engine_requests_waiting "),
        "an overflowing sum is no figure:\n{m}"
    );
    assert_eq!(sample(&m, "llmslo_engine_requests_running", &[]), 3.0);
    // Requests record no queue at arrival rather than +Inf.
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, true, false)).await;
    assert_eq!(status, 200);
    let m = settled(&sidecar).await;
    assert!(
        sample(&m, "llmslo_engine_requests_waiting_at_arrival_count", &[]) == 0.0,
        "no request recorded a queue:\n{m}"
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_usage_chunk_with_a_nan_figure_keeps_its_counts_and_stays_hidden() {
    let events = [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3,\"total_tokens\":6},\
         \"metrics\":{\"queue_time_ms\":NaN,\"time_to_first_token_ms\":\"fast\",\"mean_itl_ms\":1e999,\
         \"generation_time_ms\":30}}\n\n",
        "data: [DONE]\n\n",
    ];
    let pieces = events
        .iter()
        .map(|e| (std::time::Duration::from_millis(20), e.as_bytes().to_vec()))
        .collect();
    let (upstream, _) = scripted_upstream(Script::sse(pieces)).await;
    let sidecar = start_sidecar(upstream, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(3, true, false)).await;
    assert_eq!(status, 200);
    let body = String::from_utf8_lossy(&body);
    assert!(
        !body.contains("usage"),
        "the usage chunk llmslo asked for is hidden:\n{body}"
    );
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_token_count_source_total", &[("source", "usage")]),
        1.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_count", &[]),
        1.0,
        "{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_engine_request_metrics_unreadable_fields_total", &[]),
        3.0,
        "{m}"
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_counts_are_scraped_after_the_drain() {
    use std::time::Duration;
    let (upstream, _) = start_engine(timed_engine(10, 100)).await;
    let sidecar = start_sidecar(upstream, "final_scrape_grace: 30s\n").await;
    let metrics = sidecar.metrics_addr;
    let scrape = move || async move {
        let request = b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        raw_exchange(metrics, request, Duration::from_secs(2)).await
    };
    assert!(scrape().await.contains("HTTP/1.1 200"), "a scraper is watching");
    // A 1 s stream is in flight when the drain starts.
    let stream = tokio::spawn(post_collect(
        sidecar.proxy_addr,
        "/v1/chat/completions",
        chat_body(10, true, false),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = tokio::spawn(sidecar.shutdown());
    let (status, _) = stream.await.unwrap();
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !stopping.is_finished(),
        "the metrics port waits for a scrape after the drain"
    );
    let last = scrape().await;
    assert_eq!(
        sample(&last, "llmslo_requests_total", &[("outcome", "success")]),
        1.0,
        "{last}"
    );
    // The scrape was the one it waited for: the rest stops at once.
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .unwrap()
        .unwrap();
}

/// A histogram page of `series` series with long label values: near the sample cap and the
/// byte bound at once, the most a merged page can make the sidecar keep.
fn worst_allowed_page(series: usize) -> String {
    let mut page =
        String::from("# HELP vllm:worst A page as large as the bounds allow.\n# TYPE vllm:worst histogram\n");
    let pad = "p".repeat(150);
    for i in 0..series {
        for le in ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "+Inf"] {
            page.push_str(&format!("vllm:worst_bucket{{s=\"{pad}-{i}\",le=\"{le}\"}} {i}\n"));
        }
        page.push_str(&format!(
            "vllm:worst_sum{{s=\"{pad}-{i}\"}} 1.5\nvllm:worst_count{{s=\"{pad}-{i}\"}} {i}\n"
        ));
    }
    page
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_engine_page_the_bounds_allow_stays_within_memory_and_cpu() {
    use std::time::Duration;
    let page = worst_allowed_page(1_600);
    assert!(page.len() > 3 << 20 && page.len() < 4 << 20, "{} bytes", page.len());
    let upstream = engine_with_page(page).await;
    let sidecar = process::SidecarProcess::start(
        upstream,
        "engine_metrics: merge\nengine_metrics_interval: 1s\nengine_metrics_max_samples: 20000\n",
        None,
    );
    let mut first = 0;
    while sample(&sidecar.scrape().await, "llmslo_engine_scrape_up", &[]) != 1.0 {
        first += 1;
        assert!(first < 100, "the page was never read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu_before = sidecar.cpu_seconds();
    let started = std::time::Instant::now();
    let mut scrapes = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let m = sidecar.scrape().await;
        assert_eq!(sample(&m, "llmslo_engine_scrape_up", &[]), 1.0, "the page is read");
        let (status, _) = sidecar.get_protobuf().await;
        assert_eq!(status, 200);
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cpu = sidecar.cpu_seconds() - cpu_before;
    let reads = started.elapsed().as_secs_f64();
    // Six reads of the page and a text and a protobuf scrape every half second: each well
    // under a second of CPU (a debug build; the release build is several times faster).
    assert!(
        cpu / (reads + 2.0 * scrapes as f64) < 0.5,
        "{cpu:.2} s of CPU for {reads:.0} reads and {scrapes} scrapes"
    );
    assert!(
        sidecar.peak_rss_bytes() < MEMORY_LIMIT,
        "peak RSS {} MiB",
        sidecar.peak_rss_bytes() >> 20
    );
    eprintln!(
        "worst page: {cpu:.2} s of CPU for {reads:.0} reads and {scrapes} text and protobuf scrapes; peak RSS {} MiB",
        sidecar.peak_rss_bytes() >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_a_million_short_lines_is_refused_cheaply() {
    use std::time::Duration;
    // 4 MiB of the shortest lines: about a million samples, each its own family.
    let mut page = String::with_capacity(4 << 20);
    let mut i = 0u32;
    while page.len() < (4 << 20) - 16 {
        page.push_str(&format!("a{i:x} 1\n"));
        i += 1;
    }
    let upstream = engine_with_page(page).await;
    let sidecar =
        process::SidecarProcess::start(upstream, "engine_metrics: merge\nengine_metrics_interval: 1s\n", None);
    let cpu_before = sidecar.cpu_seconds();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let m = sidecar.scrape().await;
    assert_eq!(sample(&m, "llmslo_engine_scrape_up", &[]), 0.0, "refused whole");
    let cpu = sidecar.cpu_seconds() - cpu_before;
    assert!(cpu < 2.0, "{cpu:.2} s of CPU for about four reads");
    assert!(
        sidecar.peak_rss_bytes() < 64 << 20,
        "peak RSS {} MiB",
        sidecar.peak_rss_bytes() >> 20
    );
    eprintln!(
        "a million short lines: {cpu:.2} s of CPU for four reads, peak RSS {} MiB",
        sidecar.peak_rss_bytes() >> 20
    );
}

/// A 4 MiB chat request whose `metadata`, `user` and `safety_identifier` are dense arrays.
fn dense_fields_body() -> String {
    let dense = format!("[{}0]", "0,".repeat(480_000));
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"max_tokens":1,"metadata":{{"x":{dense},"user_id":"a"}},"user":{dense},"safety_identifier":{dense}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_fields_full_of_arrays_cost_their_bytes_not_a_tree() {
    let (upstream, _) = start_engine(timed_engine(5, 5)).await;
    let tenants = "tenants:\n  from:\n    - body: safety_identifier\n    - body: user\n    - body: metadata.user_id\n";
    let sidecar = process::SidecarProcess::start(upstream, tenants, None);
    let body = dense_fields_body();
    assert!(body.len() > 2 << 20 && body.len() < 4 << 20, "{}", body.len());
    let before = sidecar.rss_bytes();
    // Four at once, twice over.
    for _ in 0..2 {
        let sent: Vec<_> = (0..4)
            .map(|_| tokio::spawn(post_collect(sidecar.proxy, "/v1/chat/completions", body.clone())))
            .collect();
        for request in sent {
            assert_eq!(request.await.unwrap().0, 200);
        }
    }
    let peak = sidecar.peak_rss_bytes();
    eprintln!("RSS {} MiB before, peak {} MiB", before >> 20, peak >> 20);
    // Their bodies (16 MiB, within max_buffered_request_bytes) and no JSON tree: a tree of
    // one such body alone took 40 MiB.
    assert!(
        peak < before + (40 << 20),
        "peak {} MiB from {} MiB",
        peak >> 20,
        before >> 20
    );
    let m = sidecar.scrape().await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("tenant", "a"), ("outcome", "success")]),
        8.0,
        "the tenant is still read: {m}"
    );
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_cut_at_the_drain_deadline_are_counted_before_the_final_scrape() {
    use std::time::Duration;
    // 100 streams of 10 s each, and a drain of 1 s: every one is still open at the deadline.
    let (upstream, _) = start_engine(timed_engine(10, 100)).await;
    let sidecar = start_sidecar(upstream, "drain_timeout: 1s\nfinal_scrape_grace: 30s\n").await;
    let metrics = sidecar.metrics_addr;
    let scrape = move || async move {
        let request = b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        raw_exchange(metrics, request, Duration::from_secs(5)).await
    };
    assert!(scrape().await.contains("HTTP/1.1 200"), "a scraper is watching");
    let streams: Vec<_> = (0..100)
        .map(|_| {
            tokio::spawn(post_collect(
                sidecar.proxy_addr,
                "/v1/chat/completions",
                chat_body(100, true, false),
            ))
        })
        .collect();
    let in_flight = loop {
        let page = scrape().await;
        if sample(&page, "llmslo_requests_in_flight", &[]) == 100.0 {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(sample(&in_flight, "llmslo_requests_total", &[]), 0.0);
    let stopping = tokio::spawn(sidecar.shutdown());
    for stream in streams {
        let _ = stream.await;
    }
    // The scrape the metrics port waits for is the final one: it counts all hundred.
    let last = scrape().await;
    assert_eq!(
        sample(&last, "llmslo_requests_total", &[("outcome", "shutdown")]),
        100.0,
        "{last}"
    );
    assert_eq!(sample(&last, "llmslo_requests_total", &[]), 100.0, "{last}");
    assert_eq!(sample(&last, "llmslo_requests_in_flight", &[]), 0.0);
    // Cut by the sidecar: no SLO event, neither the client's fault nor the engine's.
    assert_eq!(sample(&last, "llmslo_slo_events_total", &[]), 0.0, "{last}");
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_stops_reading_a_request_body_is_cut_at_its_deadline() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An engine that takes the connection and the head, then never reads again.
    let engine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine_addr = engine.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = engine.accept().await {
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head).await;
            held.push(stream);
        }
    });
    let sidecar = start_sidecar(engine_addr, "upstream_timeout: 2s\n").await;
    // A 48 MiB streamed body: far past the peek and every socket buffer on the way.
    let length = 48 << 20;
    let mut client = tokio::net::TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    client.write_all(head.as_bytes()).await.unwrap();
    let (mut reading, mut writing) = client.into_split();
    let upload = tokio::spawn(async move {
        let chunk = vec![b' '; 64 << 10];
        for _ in 0..length / chunk.len() {
            if writing.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    let started = std::time::Instant::now();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), reading.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    upload.abort();
    let m = sidecar.metrics.encode();
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "timeout")]),
        1.0,
        "{m}"
    );
    assert_eq!(sample(&m, "llmslo_requests_in_flight", &[]), 0.0);
    sidecar.shutdown().await;
}

/// An engine that answers each request on a connection, then closes the connection 0–2 ms
/// later without saying so (no `Connection: close`), as a keep-alive timeout racing the next
/// request does.
async fn closing_engine() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0u64;
        while let Ok((mut stream, _)) = listener.accept().await {
            n += 1;
            let delay = std::time::Duration::from_micros(n % 3 * 1000);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                // The request's body, by its length.
                let text = String::from_utf8_lossy(&head).to_lowercase();
                let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                let length: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                let mut have = head.len() - end;
                while have < length {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => have += n,
                    }
                }
                let body = r#"{"id":"x","object":"chat.completion","model":"sim","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                tokio::time::sleep(delay).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_connection_the_engine_closed_is_never_charged_to_the_engine() {
    let engine = closing_engine().await;
    let sidecar = start_sidecar(engine, "engine: vllm\n").await;
    let mut failed = Vec::new();
    for i in 0..400 {
        let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(1, false, false)).await;
        if status != 200 {
            failed.push((i, status, String::from_utf8_lossy(&body).into_owned()));
        }
        if i % 4 == 3 {
            // Now and then a pause, as the engine's close lands between two requests.
            tokio::time::sleep(std::time::Duration::from_micros(1500)).await;
        }
    }
    let m = sidecar.metrics.encode();
    assert!(
        failed.is_empty(),
        "{} of 400 failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
        400.0,
        "{m}"
    );
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long proof (about 20 s: 50,000 requests kept, then 60 scrapers of /workload that never read): CI runs it with --include-ignored"]
async fn slow_workload_scrapers_hold_two_pages_at_most_and_never_the_proxy() {
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (upstream, _) = start_engine(timed_engine(0, 0)).await;
    let sidecar = process::SidecarProcess::start(upstream, "workload: {recent_requests: 200000}\n", None);
    // 50,000 kept requests, sent 16 at a time.
    let senders: Vec<_> = (0..16)
        .map(|_| {
            let addr = sidecar.proxy;
            tokio::spawn(async move {
                for _ in 0..50_000 / 16 + 1 {
                    assert_eq!(
                        post_collect(addr, "/v1/chat/completions", chat_body(1, false, false))
                            .await
                            .0,
                        200
                    );
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    let before = sidecar.rss_bytes();
    // 60 scrapers ask for the page and never read it.
    let mut scrapers = Vec::new();
    for _ in 0..60 {
        let mut stream = tokio::net::TcpStream::connect(sidecar.metrics).await.unwrap();
        stream
            .write_all(b"GET /workload HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        scrapers.push(stream);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A proxied request is served at once while they hold.
    let started = std::time::Instant::now();
    assert_eq!(
        post_collect(sidecar.proxy, "/v1/chat/completions", chat_body(1, false, false))
            .await
            .0,
        200
    );
    let waited = started.elapsed();
    let mut refused = 0;
    for stream in &mut scrapers {
        let mut head = [0u8; 12];
        if tokio::time::timeout(Duration::from_millis(200), stream.read_exact(&mut head))
            .await
            .is_ok()
            && &head == b"HTTP/1.1 503"
        {
            refused += 1;
        }
    }
    let peak = sidecar.peak_rss_bytes();
    eprintln!(
        "RSS {} MiB before the scrapers, peak {} MiB; a proxied request waited {waited:?}; {refused} scrapers refused",
        before >> 20,
        peak >> 20
    );
    assert_eq!(refused, 58, "two pages at once");
    assert!(waited < Duration::from_millis(500), "{waited:?}");
    // Two copies of 50,000 rows (64 bytes each) and their frames: a few MiB.
    assert!(
        peak < before + (24 << 20),
        "peak {} MiB from {} MiB",
        peak >> 20,
        before >> 20
    );
    drop(scrapers);
    sidecar.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reopens_stalled_streams_holds_its_share_and_no_more() {
    use llmslo::tools::bench::attacks::{reopened_zero_window, ATTACKER};
    use std::time::Duration;
    let (upstream, _) = start_engine(timed_engine(10, 100)).await;
    // 40 slots in all, 20 for any one client; streams not taken are let go after 2 s.
    let sidecar = start_sidecar(upstream, "max_in_flight_requests: 40\nsend_timeout: 2s\n").await;
    // From an address of its own: four connections of 100 zero-window streams, reopened as
    // they are let go, for 10 s.
    let attack = tokio::spawn(reopened_zero_window(
        sidecar.proxy_addr,
        ATTACKER,
        4,
        100,
        Duration::from_secs(10),
    ));
    let held = async {
        while sample(&sidecar.metrics.encode(), "llmslo_requests_in_flight", &[]) < 20.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .expect("the attack holds its share");
    // Every legitimate request over the attack is served.
    let mut statuses = Vec::new();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        statuses.push(
            post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(2, true, false))
                .await
                .0,
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        statuses.len() > 20 && statuses.iter().all(|s| *s == 200),
        "{statuses:?}"
    );
    let m = sidecar.metrics.encode();
    assert!(
        sample(
            &m,
            "llmslo_requests_refused_total",
            &[("reason", "client_in_flight_limit")]
        ) > 0.0,
        "the attacker was held to its share: {m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_refused_total", &[("reason", "in_flight_limit")]),
        0.0
    );
    attack.await.unwrap();
    sidecar.shutdown().await;
}
