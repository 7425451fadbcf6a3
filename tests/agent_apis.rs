//! The Responses and Messages APIs that agents speak, and the non-streamed routes, measured
//! through the sidecar against engines whose truth is known: the simulated engine with fixed
//! delays under paused time (reasoning before the answer, faults), and scripted engines for
//! every outcome and for held-back tokens.

use crate::common::*;
use http_body_util::BodyExt;
use llmslo::tools::simulate::SimOptions;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const RESPONSES: &str = "/v1/responses";
const MESSAGES: &str = "/v1/messages";
const AVAILABILITY: &str = "slos:\n  - {name: availability, objective: 99.9, availability: true}\n";

fn responses_body(max: u32, stream: bool) -> String {
    serde_json::json!({"model": "sim", "input": "Tell me a story.", "max_output_tokens": max, "stream": stream})
        .to_string()
}

fn messages_body(max: u32, stream: bool) -> String {
    serde_json::json!({"model": "sim", "max_tokens": max, "stream": stream,
                       "messages": [{"role": "user", "content": "Tell me a story."}]})
    .to_string()
}

fn of(operation: &str) -> [(&str, &str); 1] {
    [("operation", operation)]
}

/// (TTFT, time to first answer token, TPOT) sums in seconds, for `operation`.
fn timings(m: &str, operation: &str) -> (f64, f64, f64) {
    (
        sample(m, "gen_ai_server_time_to_first_token_seconds_sum", &of(operation)),
        sample(m, "llmslo_time_to_first_answer_token_seconds_sum", &of(operation)),
        sample(m, "gen_ai_server_time_per_output_token_seconds_sum", &of(operation)),
    )
}

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() < 0.0005
}

#[tokio::test(start_paused = true)]
async fn reasoning_then_answer_is_timed_exactly_on_every_api() {
    // First token at 250 ms, then one every 20 ms; 4 reasoning tokens before the answer.
    let options = SimOptions {
        reasoning_tokens: 4,
        ..timed_engine(250, 20)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, "engine: vllm\n").await;
    for (route, body, operation, marker) in [
        (
            RESPONSES,
            responses_body(10, true),
            "responses",
            "event: response.reasoning_text.delta",
        ),
        (MESSAGES, messages_body(10, true), "messages", "\"thinking_delta\""),
        (
            "/v1/chat/completions",
            chat_body(10, true, true),
            "chat",
            "\"reasoning_content\"",
        ),
    ] {
        let (status, received) = post_collect(sidecar.proxy_addr, route, body).await;
        assert_eq!(status, 200);
        assert!(
            String::from_utf8_lossy(&received).contains(marker),
            "{operation}: reasoning streamed"
        );
        let m = settled(&sidecar).await;
        let (ttft, answer, tpot) = timings(&m, operation);
        assert!(
            close(ttft, 0.250),
            "{operation}: TTFT at the first reasoning token: {ttft}"
        );
        assert!(
            close(answer, 0.330),
            "{operation}: answer after 4 reasoning tokens: {answer}"
        );
        assert!(
            close(tpot, 0.020),
            "{operation}: TPOT over reasoning and answer: {tpot}"
        );
        assert_eq!(
            sample(&m, "llmslo_output_tokens_total", &of(operation)),
            10.0,
            "{operation}"
        );
        assert_eq!(
            sample(&m, "llmslo_inter_chunk_latency_seconds_count", &of(operation)),
            9.0
        );
    }
    let m = settled(&sidecar).await;
    // Usage states reasoning tokens on the Responses API and chat; the Messages API does not.
    assert_eq!(sample(&m, "llmslo_reasoning_tokens_total", &of("responses")), 4.0);
    assert_eq!(sample(&m, "llmslo_reasoning_tokens_total", &of("messages")), 0.0);
    assert_eq!(sample(&m, "llmslo_requests_total", &[("outcome", "success")]), 3.0);
}

#[tokio::test(start_paused = true)]
async fn without_reasoning_the_first_answer_token_is_the_first_token() {
    let (engine, _stop) = start_engine(timed_engine(120, 15)).await;
    let sidecar = start_sidecar(engine, "engine: vllm\n").await;
    for (route, body, operation) in [
        (RESPONSES, responses_body(6, true), "responses"),
        (MESSAGES, messages_body(6, true), "messages"),
        (
            "/v1/completions",
            serde_json::json!({"model": "sim", "prompt": "x", "max_tokens": 6, "stream": true}).to_string(),
            "text_completion",
        ),
    ] {
        let (status, received) = post_collect(sidecar.proxy_addr, route, body).await;
        assert_eq!(status, 200);
        assert!(!String::from_utf8_lossy(&received).contains("[DONE]") || operation == "text_completion");
        let m = settled(&sidecar).await;
        let (ttft, answer, tpot) = timings(&m, operation);
        assert!(
            close(ttft, 0.120) && close(answer, 0.120),
            "{operation}: {ttft} {answer}"
        );
        assert!(close(tpot, 0.015), "{operation}: {tpot}");
        let input = sample(&m, "llmslo_input_tokens_total", &of(operation));
        assert!(input >= 1.0, "{operation}: input tokens from usage");
    }
}

#[tokio::test(start_paused = true)]
async fn non_streamed_answers_and_embeddings_count_outcome_e2e_and_usage() {
    let (engine, _stop) = start_engine(timed_engine(100, 10)).await;
    let sidecar = start_sidecar(engine, &format!("engine: vllm\n{AVAILABILITY}")).await;
    let embeddings = serde_json::json!({"model": "sim", "input": "sixteen characters"}).to_string();
    for (route, body, operation, output) in [
        (RESPONSES, responses_body(5, false), "responses", 5.0),
        (MESSAGES, messages_body(5, false), "messages", 5.0),
        ("/v1/embeddings", embeddings, "embeddings", 0.0),
    ] {
        let (status, _) = post_collect(sidecar.proxy_addr, route, body).await;
        assert_eq!(status, 200, "{operation}");
        let m = settled(&sidecar).await;
        let ops = of(operation);
        let success = [("operation", operation), ("outcome", "success")];
        assert_eq!(sample(&m, "llmslo_requests_total", &success), 1.0, "{operation}");
        assert_eq!(sample(&m, "gen_ai_server_request_duration_seconds_count", &ops), 1.0);
        let e2e = sample(&m, "gen_ai_server_request_duration_seconds_sum", &ops);
        assert!(e2e >= 0.1, "{operation}: e2e {e2e}");
        assert_eq!(sample(&m, "llmslo_output_tokens_total", &ops), output, "{operation}");
        assert!(sample(&m, "llmslo_input_tokens_total", &ops) >= 1.0, "{operation}");
        assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &ops), 0.0);
    }
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_slo_events_total", &[("slo", "availability")]), 3.0);
    // Four characters a token in the simulator: "sixteen characters" is 4 tokens.
    assert_eq!(sample(&m, "llmslo_input_tokens_total", &of("embeddings")), 4.0);
}

#[tokio::test(start_paused = true)]
async fn engine_failures_mid_stream_burn_the_budget_on_every_api() {
    for (fault, expected_end) in [("midstream", true), ("abort", false)] {
        let options = SimOptions {
            midstream_error_rate: f64::from(u8::from(fault == "midstream")),
            abort_rate: f64::from(u8::from(fault == "abort")),
            ..timed_engine(50, 5)
        };
        let (engine, _stop) = start_engine(options).await;
        let sidecar = start_sidecar(engine, &format!("engine: vllm\n{AVAILABILITY}")).await;
        for (route, body, operation, end_event) in [
            (
                RESPONSES,
                responses_body(8, true),
                "responses",
                "event: response.failed",
            ),
            (MESSAGES, messages_body(8, true), "messages", "overloaded_error"),
        ] {
            let response = post(sidecar.proxy_addr, route, body).await;
            assert_eq!(response.status(), 200);
            let body = response.into_body().collect().await;
            if expected_end {
                let text = String::from_utf8_lossy(&body.unwrap().to_bytes()).into_owned();
                assert!(text.contains(end_event), "{operation}: {text}");
            } else {
                assert!(body.is_err(), "{operation}: the abort reaches the client");
            }
            let m = settled(&sidecar).await;
            let failed = [("operation", operation), ("outcome", "upstream_error")];
            assert_eq!(
                sample(&m, "llmslo_requests_total", &failed),
                1.0,
                "{fault} {operation}\n{m}"
            );
        }
        let m = settled(&sidecar).await;
        assert_eq!(
            sample(&m, "llmslo_slo_bad_events_total", &[("slo", "availability")]),
            2.0
        );
        sidecar.shutdown().await;
    }
}

/// One scripted case: its name, its events (delay before in ms, bytes), whether the engine
/// closes the connection after them, and the outcome it must be counted as.
type Case = (&'static str, Vec<(u64, String)>, bool, &'static str);

/// A scripted 200 event stream of `events`, each `(delay before in ms, bytes)`.
fn typed_stream(events: &[(u64, &str)]) -> Script {
    Script::sse(
        events
            .iter()
            .map(|(ms, e)| (Duration::from_millis(*ms), e.as_bytes().to_vec()))
            .collect(),
    )
}

fn event(kind: &str, data: serde_json::Value) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

fn delta(text: &str) -> String {
    event(
        "response.output_text.delta",
        serde_json::json!({"type": "response.output_text.delta", "delta": text, "output_index": 0}),
    )
}

fn completed(status: &str, output_tokens: u64) -> String {
    let usage = serde_json::json!({"input_tokens": 3, "output_tokens": output_tokens});
    event(
        "response.completed",
        serde_json::json!({"type": "response.completed", "response": {"status": status, "usage": usage}}),
    )
}

/// Sends one request through a sidecar in front of `case`'s scripted engine; checks its
/// outcome and that only an engine failure burns the availability budget; returns the metrics.
async fn run_case(route: &str, body: String, operation: &str, case: Case) -> String {
    let (name, events, cut_short, outcome) = case;
    let events: Vec<(u64, &str)> = events.iter().map(|(ms, e)| (*ms, e.as_str())).collect();
    let mut script = typed_stream(&events);
    script.cut_short = cut_short;
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, &format!("engine: vllm\n{AVAILABILITY}")).await;
    let response = post(sidecar.proxy_addr, route, body).await;
    let _ = response.into_body().collect().await;
    let m = settled(&sidecar).await;
    let labels = [("operation", operation), ("outcome", outcome)];
    assert_eq!(sample(&m, "llmslo_requests_total", &labels), 1.0, "{name}\n{m}");
    let bad = sample(&m, "llmslo_slo_bad_events_total", &[("slo", "availability")]);
    assert_eq!(bad, f64::from(u8::from(outcome == "upstream_error")), "{name}");
    sidecar.shutdown().await;
    m
}

#[tokio::test(start_paused = true)]
async fn every_responses_outcome() {
    let created = event(
        "response.created",
        serde_json::json!({"response": {"status": "in_progress"}}),
    );
    let invalid = event(
        "error",
        serde_json::json!({"type": "error", "code": "invalid_request_error", "message": "top_logprobs is too large"}),
    );
    let overloaded = event(
        "error",
        serde_json::json!({"type": "error", "code": "server_error", "message": "x"}),
    );
    let failed = event(
        "response.failed",
        serde_json::json!({"response": {"status": "failed", "error": {"code": "server_error", "message": "x"}}}),
    );
    let incomplete = event(
        "response.incomplete",
        serde_json::json!({"response": {"status": "incomplete", "usage": {"input_tokens": 3, "output_tokens": 2}}}),
    );
    let cases: Vec<Case> = vec![
        (
            "completed",
            vec![
                (1, created.clone()),
                (50, delta("a")),
                (10, delta("b")),
                (1, completed("completed", 2)),
            ],
            false,
            "success",
        ),
        (
            "cut at max tokens",
            vec![
                (1, created.clone()),
                (50, delta("a")),
                (10, delta("b")),
                (1, completed("incomplete", 2)),
            ],
            false,
            "success",
        ),
        (
            "incomplete",
            vec![
                (1, created.clone()),
                (50, delta("a")),
                (10, delta("b")),
                (1, incomplete),
            ],
            false,
            "success",
        ),
        (
            "failed",
            vec![(1, created.clone()), (50, delta("a")), (1, failed)],
            false,
            "upstream_error",
        ),
        (
            "error event",
            vec![(1, created.clone()), (50, delta("a")), (1, overloaded)],
            false,
            "upstream_error",
        ),
        (
            "in-band 400",
            vec![(1, created.clone()), (1, invalid)],
            false,
            "client_error",
        ),
        (
            "cut short",
            vec![(1, created.clone()), (50, delta("a"))],
            true,
            "upstream_error",
        ),
    ];
    for case in cases {
        run_case(RESPONSES, responses_body(2, true), "responses", case).await;
    }
}

#[tokio::test(start_paused = true)]
async fn every_messages_outcome() {
    let start = event(
        "message_start",
        serde_json::json!({"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 0}}}),
    );
    let text = |t: &str| {
        event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
        )
    };
    let end = event(
        "message_delta",
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
    ) + &event("message_stop", serde_json::json!({"type": "message_stop"}));
    let ping = event("ping", serde_json::json!({"type": "ping"}));
    let error = |kind: &str| {
        event(
            "error",
            serde_json::json!({"type": "error", "error": {"type": kind, "message": "x"}}),
        )
    };
    let cases: Vec<Case> = vec![
        (
            "completed",
            vec![
                (50, start.clone()),
                (0, text("a")),
                (1, ping.clone()),
                (10, text("b")),
                (1, end.clone()),
            ],
            false,
            "success",
        ),
        (
            "overloaded",
            vec![(50, start.clone()), (0, text("a")), (1, error("overloaded_error"))],
            false,
            "upstream_error",
        ),
        (
            "invalid request",
            vec![(1, error("invalid_request_error"))],
            false,
            "client_error",
        ),
        (
            "cut short",
            vec![(50, start.clone()), (0, text("a"))],
            true,
            "upstream_error",
        ),
    ];
    for case in cases {
        let completed = case.0 == "completed";
        let m = run_case(MESSAGES, messages_body(2, true), "messages", case).await;
        if completed {
            let ops = of("messages");
            assert_eq!(sample(&m, "llmslo_output_tokens_total", &ops), 2.0);
            assert_eq!(sample(&m, "llmslo_input_tokens_total", &ops), 3.0);
            let gaps = sample(&m, "llmslo_inter_chunk_latency_seconds_count", &ops);
            assert_eq!(gaps, 1.0, "ping is no token");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_mid_stream_is_cancelled_on_both_apis() {
    let (engine, _stop) = start_engine(timed_engine(50, 100)).await;
    let sidecar = start_sidecar(engine, &format!("engine: vllm\n{AVAILABILITY}")).await;
    for (route, body) in [
        (RESPONSES, responses_body(50, true)),
        (MESSAGES, messages_body(50, true)),
    ] {
        let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
        let head = format!(
            "POST {route} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await; // a few tokens in
        drop(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = settled(&sidecar).await;
    for operation in ["responses", "messages"] {
        let cancelled = [("operation", operation), ("outcome", "client_cancelled")];
        assert_eq!(sample(&m, "llmslo_requests_total", &cancelled), 1.0, "{operation}\n{m}");
    }
    assert_eq!(
        sample(&m, "llmslo_slo_bad_events_total", &[("slo", "availability")]),
        0.0
    );
}

/// Eight tokens generated every 10 ms from 100 ms; the engine holds back the text of the
/// first three (sent together at 120 ms) and of the last (sent only with the closing events
/// at 170 ms). True TPOT: 70 ms / 7 = 10 ms; TTFT: 120 ms.
#[tokio::test(start_paused = true)]
async fn held_back_tokens_do_not_bias_tpot() {
    // Messages: `message_start` goes out with the first token, its text held back.
    let start = event(
        "message_start",
        serde_json::json!({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
    );
    let text = |t: &str| {
        event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}),
        )
    };
    let end = event(
        "content_block_stop",
        serde_json::json!({"type": "content_block_stop", "index": 0}),
    ) + &event(
        "message_delta",
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 8}}),
    ) + &event("message_stop", serde_json::json!({"type": "message_stop"}));
    let (first, later) = (text(" tok en tok"), text(" en"));
    let messages = [
        (100, start.as_str()),
        (20, &first),
        (10, &later),
        (10, &later),
        (10, &later),
        (10, &later),
        (10, &end),
    ];
    // Responses: nothing marks the first token; the tokenizer counts the first delta's tokens.
    let done = event(
        "response.output_text.done",
        serde_json::json!({"type": "response.output_text.done", "text": "x"}),
    ) + &completed("incomplete", 8);
    let created = event(
        "response.created",
        serde_json::json!({"response": {"status": "in_progress"}}),
    );
    let (first_delta, later_delta) = (delta(" tok en tok"), delta(" en"));
    let responses = [
        (2, created.as_str()),
        (118, &first_delta),
        (10, &later_delta),
        (10, &later_delta),
        (10, &later_delta),
        (10, &later_delta),
        (10, &done),
    ];
    let tokenizer = format!(
        "engine: vllm\ntokenizer: {}/tests/fixtures/tokenizer\n",
        env!("CARGO_MANIFEST_DIR")
    );
    for (route, body, operation, events) in [
        (MESSAGES, messages_body(8, true), "messages", &messages),
        (RESPONSES, responses_body(8, true), "responses", &responses),
    ] {
        let (upstream, _) = scripted_upstream(typed_stream(events)).await;
        let sidecar = start_sidecar(upstream, &tokenizer).await;
        let (status, _) = post_collect(sidecar.proxy_addr, route, body).await;
        assert_eq!(status, 200);
        let m = settled(&sidecar).await;
        let (ttft, _, tpot) = timings(&m, operation);
        assert!(close(ttft, 0.120), "{operation}: TTFT at the first delta: {ttft}");
        assert!(
            close(tpot, 0.010),
            "{operation}: 70 ms over 7 steps, not 50 ms over 7: {tpot}"
        );
        assert_eq!(sample(&m, "llmslo_output_tokens_total", &of(operation)), 8.0);
        sidecar.shutdown().await;
    }
}

/// Reads from `stream` until `marker` has arrived (or the stream ends).
async fn read_until(stream: &mut TcpStream, marker: &[u8]) {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !seen.windows(marker.len()).any(|w| w == marker) {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buffer[..n]),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_at_the_end_signal_has_its_answer() {
    // The openai SDK stops at `[DONE]` and closes before the body's last bytes arrive.
    let chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    let script = Script::sse(vec![
        (Duration::from_millis(50), chunk.as_bytes().to_vec()),
        (Duration::from_millis(10), chunk.as_bytes().to_vec()),
        (Duration::from_millis(1), b"data: [DONE]\n\n".to_vec()),
        (
            Duration::from_millis(500),
            b": the engine's last bytes come late\n\n".to_vec(),
        ),
    ]);
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, &format!("engine: vllm\ninject_usage: false\n{AVAILABILITY}")).await;
    let body = chat_body(2, true, false);
    for marker in [&b"[DONE]"[..], b"\"hi\""] {
        let mut stream = TcpStream::connect(sidecar.proxy_addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        read_until(&mut stream, marker).await;
        drop(stream);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "success")]),
        1.0,
        "read to [DONE]\n{m}"
    );
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "client_cancelled")]),
        1.0,
        "left mid-answer"
    );
    // Both ended when their client left (after [DONE] at 61 ms, after the first token at
    // 50 ms), neither with the engine's late bytes at 561 ms.
    let e2e = sample(
        &m,
        "gen_ai_server_request_duration_seconds_sum",
        &[("operation", "chat")],
    );
    assert!((0.1..0.13).contains(&e2e), "ended when the clients left: {e2e}");
}

#[tokio::test]
async fn uploads_and_typed_api_requests_reach_the_engine_unchanged() {
    let answer = Script {
        head: "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked".to_string(),
        pieces: vec![(
            Duration::ZERO,
            br#"{"text":"hello","usage":{"type":"tokens","input_tokens":30,"output_tokens":2}}"#.to_vec(),
        )],
        cut_short: false,
        silent: false,
        trailers: String::new(),
    };
    let (upstream, log) = scripted_upstream(answer).await;
    let sidecar = start_sidecar(upstream, "engine: vllm\n").await;
    // A transcription upload is multipart: forwarded at once, not peeked for a model.
    let upload = "--b\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b\r\n\
                  content-disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
                  content-type: audio/wav\r\n\r\nRIFF\x00\x01\r\n--b--\r\n";
    let request = http::Request::post(format!("http://{}/v1/audio/transcriptions", sidecar.proxy_addr))
        .header(http::header::CONTENT_TYPE, "multipart/form-data; boundary=b")
        .body(http_body_util::Full::new(bytes::Bytes::from(upload)))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let _ = response.into_body().collect().await;
    assert!(request_to(&log, "POST /v1/audio/transcriptions").ends_with(upload));
    // The typed APIs always report usage: nothing is added to their requests.
    for (route, body) in [(RESPONSES, responses_body(4, true)), (MESSAGES, messages_body(4, true))] {
        let _ = post_collect(sidecar.proxy_addr, route, body.clone()).await;
        assert!(request_to(&log, &format!("POST {route}")).ends_with(&body), "{route}");
    }
    let m = settled(&sidecar).await;
    let transcription = [("operation", "transcription"), ("outcome", "success")];
    assert_eq!(sample(&m, "llmslo_requests_total", &transcription), 1.0, "{m}");
    assert_eq!(sample(&m, "llmslo_input_tokens_total", &of("transcription")), 30.0);
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &of("transcription")), 2.0);
}
