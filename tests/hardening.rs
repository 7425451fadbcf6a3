//! Hardening: a client's fault is never counted against the engine, every limit holds in
//! aggregate as well as per request, and responses an engine frames oddly are still right.
//! Each test drives real sockets on 127.0.0.1 and checks that the proxy keeps serving after.

use crate::common::*;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

/// Waits until `name{labels}` reaches `value` in the sidecar's metrics; returns the text.
async fn wait_for(sidecar: &llmslo::sidecar::Sidecar, name: &str, labels: &[(&str, &str)], value: f64) -> String {
    for _ in 0..500 {
        let text = sidecar.metrics.encode();
        if sample(&text, name, labels) >= value {
            settle(sidecar).await;
            return sidecar.metrics.encode();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}{labels:?} never reached {value}:\n{}", sidecar.metrics.encode());
}

fn outcome(text: &str, outcome: &str) -> f64 {
    sample(text, "llmslo_requests_total", &[("outcome", outcome)])
}

/// A follow-up request still goes through: the fault broke nothing else.
async fn still_serves(addr: SocketAddr) {
    let (status, body) = post_collect(addr, CHAT, "{}".into()).await;
    assert_eq!(
        (status, &body[..]),
        (200, &b"{\"read\":2}"[..]),
        "the proxy still serves"
    );
}

fn head(path: &str, framing: &str) -> Vec<u8> {
    format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{framing}\r\n\r\n").into_bytes()
}

#[tokio::test]
async fn a_client_aborting_its_upload_is_cancelled_below_and_above_the_peek_limit() {
    let upstream = body_reading_upstream().await;
    let sidecar = start_sidecar(upstream, "max_peek_bytes: 1024\n").await;
    for (length, sent) in [(512, 100), (1 << 20, 8192)] {
        let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
        stream
            .write_all(&head(CHAT, &format!("content-length: {length}")))
            .await
            .unwrap();
        stream.write_all(&vec![b' '; sent]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await; // past the peek: forwarding
        drop(stream);
    }
    let m = wait_for(
        &sidecar,
        "llmslo_requests_total",
        &[("outcome", "client_cancelled")],
        2.0,
    )
    .await;
    assert_eq!(outcome(&m, "client_cancelled"), 2.0, "{m}");
    assert_eq!(
        outcome(&m, "upstream_error"),
        0.0,
        "a client's abort is not the engine's fault"
    );
    still_serves(sidecar.proxy_addr).await;
}

#[tokio::test]
async fn broken_chunked_framing_is_a_400_client_error_on_every_route() {
    let upstream = body_reading_upstream().await;
    let sidecar = start_sidecar(upstream, "max_peek_bytes: 1024\n").await;
    // A generation upload whose framing breaks past the peek limit, while being forwarded.
    let mut request = head(CHAT, "transfer-encoding: chunked");
    request.extend_from_slice(format!("{:x}\r\n{}\r\nzz\r\n", 2000, " ".repeat(2000)).as_bytes());
    let answer = raw_exchange(sidecar.proxy_addr, &request, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"type\":\"bad_request_body\""), "{answer}");
    let m = wait_for(&sidecar, "llmslo_requests_total", &[("outcome", "client_error")], 1.0).await;
    assert_eq!(outcome(&m, "upstream_error"), 0.0, "{m}");

    // Any other route: an overflowing chunk size is the client's framing, not an unavailable engine.
    let mut request = head("/v1/embeddings", "transfer-encoding: chunked");
    request.extend_from_slice(b"FFFFFFFFFFFFFFFFF1\r\nabc\r\n0\r\n\r\n");
    let answer = raw_exchange(sidecar.proxy_addr, &request, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("framing is malformed"), "{answer}");
    assert!(!answer.contains("upstream_unavailable"), "{answer}");
    still_serves(sidecar.proxy_addr).await;
}

#[tokio::test]
async fn bodies_over_max_body_bytes_get_413_at_once() {
    let upstream = body_reading_upstream().await;
    let sidecar = start_sidecar(upstream, "max_peek_bytes: 1024\nmax_body_bytes: 4096\n").await;
    // A declared length over the limit is answered before a byte of the body is sent.
    let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    stream
        .write_all(&head(CHAT, "content-length: 3000000000"))
        .await
        .unwrap();
    let answer = read_for(&mut stream, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"type\":\"request_too_large\""), "{answer}");
    assert!(answer.contains("4096 bytes"), "{answer}");
    // Chunked bodies crossing it: inside the peek, and past it while being forwarded.
    for size in [2000, 5000] {
        let mut request = head(CHAT, "transfer-encoding: chunked");
        for _ in 0..size / 500 {
            request.extend_from_slice(format!("1f4\r\n{}\r\n", " ".repeat(500)).as_bytes());
        }
        request.extend_from_slice(b"0\r\n\r\n");
        let answer = raw_exchange(sidecar.proxy_addr, &request, Duration::from_secs(5)).await;
        let want = if size > 4096 { "HTTP/1.1 413" } else { "HTTP/1.1 200" };
        assert!(answer.starts_with(want), "{size} bytes: {answer}");
    }
    let m = wait_for(&sidecar, "llmslo_requests_total", &[("outcome", "client_error")], 2.0).await;
    assert_eq!(outcome(&m, "client_error"), 2.0, "{m}");
    assert_eq!(outcome(&m, "upstream_error"), 0.0, "{m}");
    // Other routes (uploads of files, say) are not held to the generation limit.
    let mut request = head("/v1/files", "content-length: 6000");
    request.extend_from_slice(&[b'x'; 6000]);
    let answer = raw_exchange(sidecar.proxy_addr, &request, Duration::from_secs(2)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    still_serves(sidecar.proxy_addr).await;
}

#[tokio::test(start_paused = true)]
async fn stale_content_length_goes_when_the_engine_also_sends_transfer_encoding() {
    let sse = fixture("vllm-chat.sse");
    let script = Script {
        head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 5\r\ntransfer-encoding: chunked"
            .to_string(),
        ..Script::sse(vec![
            (Duration::ZERO, sse[..300].to_vec()),
            (Duration::from_millis(5), sse[300..].to_vec()),
        ])
    };
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "").await;
    let body = r#"{"model":"tiny","stream":true,"stream_options":{"include_usage":true}}"#;
    let response = post(sidecar.proxy_addr, CHAT, body.into()).await;
    assert!(response.headers().get("content-length").is_none());
    let received = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(received, Bytes::from(sse), "the whole stream, not 5 bytes");
    let m = settled(&sidecar).await;
    assert_eq!(outcome(&m, "success"), 1.0, "{m}");
}

#[tokio::test(start_paused = true)]
async fn a_chunked_stream_ending_in_trailers_is_a_success() {
    let sse = fixture("vllm-chat.sse");
    for stripped in [false, true] {
        let script = Script {
            trailers: "x-engine-trailer: done".to_string(),
            ..Script::sse(vec![(Duration::ZERO, sse.clone())])
        };
        let (upstream, _) = scripted_upstream(script).await;
        let sidecar = start_sidecar(upstream, "").await;
        // Asking for no usage makes the sidecar inject it and hold events back to cut it.
        let body = if stripped {
            r#"{"model":"tiny","stream":true}"#
        } else {
            r#"{"model":"tiny","stream":true,"stream_options":{"include_usage":true}}"#
        };
        let (status, _) = post_collect(sidecar.proxy_addr, CHAT, body.into()).await;
        assert_eq!(status, 200);
        let m = settled(&sidecar).await;
        assert_eq!(outcome(&m, "success"), 1.0, "stripping {stripped}: {m}");
        assert_eq!(outcome(&m, "client_cancelled"), 0.0, "stripping {stripped}: {m}");
    }
}

/// Gzip of `events` as a streaming server writes it: flushed after every event, each flush
/// its own piece (the last one carries the gzip trailer).
fn gzip_pieces(events: &[&[u8]]) -> Vec<Vec<u8>> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut pieces = Vec::new();
    for event in events {
        encoder.write_all(event).unwrap();
        encoder.flush().unwrap();
        pieces.push(std::mem::take(encoder.get_mut()));
    }
    let last = encoder.finish().unwrap();
    pieces.last_mut().unwrap().extend_from_slice(&last);
    pieces
}

#[tokio::test(start_paused = true)]
async fn a_compressed_stream_is_measured_from_a_decoded_copy_and_forwarded_untouched() {
    let sse = fixture("vllm-chat.sse");
    let text = String::from_utf8(sse.clone()).unwrap();
    let events: Vec<&[u8]> = text.split_inclusive("\n\n").map(str::as_bytes).collect();
    let pieces = gzip_pieces(&events);
    let compressed = pieces.concat();
    // The role chunk at once, then one event every 20 ms: the first token at 20 ms.
    let script = Script {
        head:
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked"
                .to_string(),
        ..Script::sse(
            pieces
                .into_iter()
                .enumerate()
                .map(|(i, piece)| (Duration::from_millis(if i == 0 { 0 } else { 20 }), piece))
                .collect(),
        )
    };
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "").await;
    let body = r#"{"model":"tiny","stream":true,"stream_options":{"include_usage":true}}"#;
    let response = post(sidecar.proxy_addr, CHAT, body.into()).await;
    assert_eq!(response.headers()["content-encoding"], "gzip");
    let received = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        received,
        Bytes::from(compressed),
        "the client gets the compressed bytes"
    );
    let m = settled(&sidecar).await;
    assert_eq!(outcome(&m, "success"), 1.0, "{m}");
    assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &[]), 1.0);
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[("model", "tiny")]), 16.0);
    let ttft = sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &[]);
    assert!((ttft - 0.020).abs() < 0.002, "TTFT {ttft}");
    let tpot = sample(&m, "gen_ai_server_time_per_output_token_seconds_sum", &[]);
    assert!((tpot - 0.020).abs() < 0.002, "TPOT {tpot}");
}

#[tokio::test(start_paused = true)]
async fn an_encoding_llmslo_cannot_decode_is_unmeasured_not_an_engine_error() {
    let script = Script {
        head: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: x-custom\r\ntransfer-encoding: chunked"
            .to_string(),
        ..Script::sse(vec![(Duration::ZERO, b"\x00\x01 opaque bytes".to_vec())])
    };
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, CHAT, r#"{"model":"tiny","stream":true}"#.into()).await;
    assert_eq!((status, &body[..]), (200, &b"\x00\x01 opaque bytes"[..]));
    // A corrupt gzip stream too.
    let script = Script {
        head:
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked"
                .to_string(),
        ..Script::sse(vec![(Duration::ZERO, b"not gzip at all".to_vec())])
    };
    let (corrupt, _) = scripted_upstream(script).await;
    let other = start_sidecar(corrupt, "").await;
    post_collect(other.proxy_addr, CHAT, r#"{"model":"tiny","stream":true}"#.into()).await;
    for (sidecar, reason) in [(&sidecar, "content_encoding"), (&other, "decode_error")] {
        let m = settled(sidecar).await;
        assert_eq!(outcome(&m, "success"), 1.0, "{m}");
        assert_eq!(outcome(&m, "upstream_error"), 0.0, "{m}");
        assert_eq!(
            sample(&m, "llmslo_unmeasured_responses_total", &[("reason", reason)]),
            1.0
        );
        assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &[]), 0.0);
    }
}

#[tokio::test(start_paused = true)]
async fn an_unrequested_101_is_a_502_and_an_upstream_error() {
    let script = Script {
        head: "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade".to_string(),
        ..Script::sse(Vec::new())
    };
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, CHAT, r#"{"model":"tiny"}"#.into()).await;
    assert_eq!(status, 502);
    assert!(
        String::from_utf8_lossy(&body).contains("upstream_protocol_error"),
        "{body:?}"
    );
    let m = settled(&sidecar).await;
    assert_eq!(outcome(&m, "upstream_error"), 1.0, "{m}");
    assert_eq!(outcome(&m, "success"), 0.0, "{m}");
}

#[tokio::test(start_paused = true)]
async fn an_engine_stalling_mid_stream_is_ended_as_a_timeout() {
    let sse = fixture("vllm-chat.sse");
    let script = Script::sse(vec![
        (Duration::ZERO, sse[..400].to_vec()),
        (Duration::from_secs(3600), sse[400..].to_vec()),
    ]);
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, "stream_idle_timeout: 10s\n").await;
    let started = tokio::time::Instant::now();
    let body = r#"{"model":"tiny","stream":true,"stream_options":{"include_usage":true}}"#;
    let response = post(sidecar.proxy_addr, CHAT, body.into()).await;
    let mut body = response.into_body();
    let mut received = Vec::new();
    let error = loop {
        match body.frame().await {
            Some(Ok(frame)) => received.extend_from_slice(frame.data_ref().unwrap()),
            Some(Err(error)) => break error,
            None => panic!("the stream ended cleanly"),
        }
    };
    assert!(
        error.is_incomplete_message() || error.to_string().contains("body"),
        "{error}"
    );
    assert_eq!(&received[..], &sse[..400], "the client got what the engine sent");
    assert_eq!(started.elapsed().as_secs(), 10, "ended after 10 s of silence");
    let m = settled(&sidecar).await;
    assert_eq!(outcome(&m, "timeout"), 1.0, "{m}");
    assert_eq!(outcome(&m, "client_cancelled"), 0.0, "{m}");
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_sends_a_byte_is_closed_after_the_head_timeout() {
    let (upstream, _) = scripted_upstream(Script::sse(Vec::new())).await;
    let sidecar = start_sidecar(upstream, "").await;
    let mut silent = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    let started = tokio::time::Instant::now();
    let answer = read_for(&mut silent, Duration::from_secs(120)).await;
    assert_eq!(answer, "", "closed without an answer");
    assert_eq!(
        started.elapsed().as_secs(),
        30,
        "closed at the head timeout, counted from accept"
    );
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_proxy_connections_open", &[]), 0.0, "{m}");
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_has_sent_nothing_holds_up_no_stop() {
    // A keep-alive client's spare connection, opened ahead of need and never used: the stop
    // closes it at once instead of waiting out the head timeout.
    let (upstream, _) = scripted_upstream(Script::sse(Vec::new())).await;
    let sidecar = start_sidecar(upstream, "").await;
    let mut spare = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = tokio::time::Instant::now();
    sidecar.shutdown().await;
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(
        read_for(&mut spare, Duration::from_secs(1)).await,
        "",
        "closed without an answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_max_connections_get_503_and_the_rest_carry_on() {
    let upstream = body_reading_upstream().await;
    let sidecar = start_sidecar(upstream, "max_connections: 2\n").await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
        stream.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap(); // a head in progress
        held.push(stream);
    }
    wait_for(&sidecar, "llmslo_proxy_connections_open", &[], 2.0).await;
    let answer = raw_exchange(
        sidecar.proxy_addr,
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("retry-after: 1") && answer.contains("max_connections"),
        "{answer}"
    );
    let m = sidecar.metrics.encode();
    assert_eq!(
        sample(&m, "llmslo_requests_refused_total", &[("reason", "connection_limit")]),
        1.0
    );
    held.clear();
    for _ in 0..100 {
        if sample(&sidecar.metrics.encode(), "llmslo_proxy_connections_open", &[]) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    still_serves(sidecar.proxy_addr).await;
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
}

/// Sends a 4 MB generation upload but withholds its last byte; returns the answer it gets
/// (empty when the refusal's close reset the connection before it was read).
async fn withheld_upload(addr: SocketAddr) -> String {
    const LENGTH: usize = 4_000_000;
    static ZEROS: [u8; 64 << 10] = [b' '; 64 << 10];
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(&head(CHAT, &format!("content-length: {LENGTH}")))
        .await
        .unwrap();
    let upload = async {
        let mut left = LENGTH - 1;
        while left > 0 {
            let n = left.min(ZEROS.len());
            if stream.write_all(&ZEROS[..n]).await.is_err() {
                break; // refused part-way: the sidecar answered and closed
            }
            left -= n;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), upload).await;
    read_for(&mut stream, Duration::from_secs(20)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withheld_uploads_are_bounded_in_aggregate_and_timed_out() {
    let upstream = body_reading_upstream().await;
    let sidecar = start_sidecar(
        upstream,
        "max_buffered_request_bytes: 16777216\nrequest_body_timeout: 2s\n",
    )
    .await;
    let before = rss_bytes();
    let uploads: Vec<_> = (0..100)
        .map(|_| tokio::spawn(withheld_upload(sidecar.proxy_addr)))
        .collect();
    let mut answers = Vec::new();
    for upload in uploads {
        answers.push(upload.await.unwrap());
    }
    let grown = rss_bytes().saturating_sub(before);
    let status = |code: &str| {
        answers
            .iter()
            .filter(|a| a.starts_with(&format!("HTTP/1.1 {code}")))
            .count()
    };
    // The budget is charged as bytes arrive: the uploads that got their bytes in first time
    // out waiting for the last one; the rest are refused part-way, once 16 MiB is held.
    let timed_out = status("408");
    assert!((1..=4).contains(&timed_out), "{timed_out} uploads timed out");
    assert!(answers
        .iter()
        .all(|a| a.is_empty() || a.starts_with("HTTP/1.1 408") || a.starts_with("HTTP/1.1 503")));
    assert!(answers.iter().any(|a| a.contains("retry-after: 1")));
    let m = wait_for(
        &sidecar,
        "llmslo_requests_total",
        &[("outcome", "client_error")],
        timed_out as f64,
    )
    .await;
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_refused_total",
            &[("reason", "request_buffer_full")]
        ) + timed_out as f64,
        100.0,
        "every upload is either refused or timed out"
    );
    assert_eq!(outcome(&m, "upstream_error"), 0.0, "{m}");
    eprintln!("RSS grew {} MiB over 100 withheld 4 MB uploads", grown >> 20);
    assert!(grown < 64 << 20, "RSS grew {} MiB", grown >> 20);
    still_serves(sidecar.proxy_addr).await; // the budget came back
}

#[tokio::test(start_paused = true)]
async fn model_names_the_engine_rejects_take_no_label_slot() {
    let (upstream, _) = scripted_upstream_by(|request| {
        if String::from_utf8_lossy(request).contains("\"bogus") {
            Script {
                head: "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2".into(),
                pieces: vec![(Duration::ZERO, b"{}".to_vec())],
                ..Script::sse(Vec::new())
            }
        } else {
            Script::sse(vec![(Duration::ZERO, fixture("vllm-chat.sse"))])
        }
    })
    .await;
    let sidecar = start_sidecar(upstream, "max_models: 2\n").await;
    for name in ["bogus-1", "bogus-2", "bogus-3", "real-1", "real-2"] {
        post_collect(
            sidecar.proxy_addr,
            CHAT,
            format!(r#"{{"model":"{name}","stream":true}}"#),
        )
        .await;
    }
    let m = settled(&sidecar).await;
    assert!(!m.contains("bogus"), "rejected names became labels:\n{m}");
    for real in ["real-1", "real-2"] {
        assert_eq!(
            sample(&m, "llmslo_requests_total", &[("model", real), ("outcome", "success")]),
            1.0,
            "{real} is learned from its successful answer"
        );
    }
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_total",
            &[("model", "other"), ("outcome", "client_error")]
        ),
        3.0
    );
}
