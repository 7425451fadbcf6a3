//! The sidecar in front of the simulated engine: timings, token counts and outcomes of
//! streamed responses, with paused tokio time so the scripted timings are exact.

use crate::common::*;
use http_body_util::BodyExt;
use llmslo::tools::simulate::SimOptions;

const CHAT: &[(&str, &str)] = &[("model", "sim"), ("operation", "chat"), ("provider", "vllm")];

fn with_outcome(outcome: &'static str) -> Vec<(&'static str, &'static str)> {
    let mut labels = CHAT.to_vec();
    labels.push(("outcome", outcome));
    labels
}

#[tokio::test(start_paused = true)]
async fn ttft_tpot_and_inter_chunk_match_the_scripted_timings() {
    let (engine, _stop) = start_engine(timed_engine(250, 20)).await;
    let sidecar = start_sidecar(engine, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(10, true, false)).await;
    assert_eq!(status, 200);
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let m = settled(&sidecar).await;

    // The role-only chunk went out at once; the first token only after 250 ms.
    let ttft = sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", CHAT);
    assert!((ttft - 0.250).abs() < 0.001, "ttft {ttft}");
    assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", CHAT), 1.0);
    let tpot = sample(&m, "gen_ai_server_time_per_output_token_seconds_sum", CHAT);
    assert!((tpot - 0.020).abs() < 0.001, "tpot {tpot}");
    // Ten tokens, one per chunk: nine gaps of 20 ms.
    assert_eq!(sample(&m, "llmslo_inter_chunk_latency_seconds_count", CHAT), 9.0);
    let gaps = sample(&m, "llmslo_inter_chunk_latency_seconds_sum", CHAT);
    assert!((gaps - 0.180).abs() < 0.001, "gaps {gaps}");
    // No usage in the stream: N counted from the events.
    assert_eq!(sample(&m, "llmslo_output_tokens_total", CHAT), 10.0);
    let e2e = sample(&m, "gen_ai_server_request_duration_seconds_sum", CHAT);
    assert!((e2e - 0.430).abs() < 0.002, "e2e {e2e}");
    assert_eq!(sample(&m, "llmslo_requests_total", &with_outcome("success")), 1.0);
}

#[tokio::test(start_paused = true)]
async fn several_tokens_per_chunk_with_usage_give_the_right_n_and_tpot() {
    let options = SimOptions {
        tokens_per_chunk: 4,
        ..timed_engine(100, 10)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, "").await;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(16, true, true)).await;
    assert_eq!(status, 200);
    let m = settled(&sidecar).await;
    // 4 chunks of 4 tokens, 40 ms apart: N = 16 from usage, TPOT = 3 × 40 ms / 15.
    assert_eq!(sample(&m, "llmslo_output_tokens_total", CHAT), 16.0);
    assert_eq!(sample(&m, "llmslo_input_tokens_total", CHAT), 2.0);
    let tpot = sample(&m, "gen_ai_server_time_per_output_token_seconds_sum", CHAT);
    assert!((tpot - 0.008).abs() < 0.0005, "tpot {tpot}");
    assert_eq!(sample(&m, "llmslo_tokens_per_chunk_sum", CHAT), 4.0);
    assert_eq!(sample(&m, "llmslo_inter_chunk_latency_seconds_count", CHAT), 3.0);
}

#[tokio::test(start_paused = true)]
async fn completions_are_measured_as_text_completion() {
    let (engine, _stop) = start_engine(timed_engine(50, 5)).await;
    let sidecar = start_sidecar(engine, "").await;
    let body = serde_json::json!({"model": "sim", "prompt": "a b c", "max_tokens": 5, "stream": true}).to_string();
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/completions", body).await;
    assert_eq!(status, 200);
    let m = settled(&sidecar).await;
    let labels = [("model", "sim"), ("operation", "text_completion")];
    let ttft = sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &labels);
    assert!((ttft - 0.050).abs() < 0.001, "ttft {ttft}");
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &labels), 5.0);
}

#[tokio::test(start_paused = true)]
async fn mid_stream_error_payload_is_an_upstream_error() {
    let options = SimOptions {
        midstream_error_rate: 1.0,
        ..timed_engine(10, 10)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
    assert_eq!(status, 200, "the engine said 200 before failing");
    assert!(String::from_utf8_lossy(&body).contains("\"error\""));
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &with_outcome("upstream_error")),
        1.0
    );
    assert_eq!(sample(&m, "llmslo_requests_total", &with_outcome("success")), 0.0);
}

#[tokio::test(start_paused = true)]
async fn upstream_closing_mid_stream_is_an_upstream_error() {
    let options = SimOptions {
        abort_rate: 1.0,
        ..timed_engine(10, 10)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, "").await;
    let response = post(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.into_body().collect().await.is_err(),
        "the client sees the cut too"
    );
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &with_outcome("upstream_error")),
        1.0
    );
    // Four token events before the cut, but no usage came to say how many tokens they held.
    assert_eq!(sample(&m, "llmslo_inter_chunk_latency_seconds_count", CHAT), 3.0);
    assert_eq!(sample(&m, "llmslo_output_tokens_total", CHAT), 0.0);
    assert_eq!(
        sample(&m, "llmslo_token_count_source_total", &[("source", "events")]),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn http_500_from_the_engine_is_an_upstream_error() {
    let options = SimOptions {
        error_rate: 1.0,
        ..timed_engine(10, 10)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, "").await;
    // An engine that fails every request teaches no model name; its model list does.
    model_learned(&sidecar, "sim").await;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
    assert_eq!(status, 500);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &with_outcome("upstream_error")),
        1.0
    );
    assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", CHAT), 0.0);
}

#[tokio::test(start_paused = true)]
async fn client_disconnecting_mid_stream_is_client_cancelled() {
    let (engine, _stop) = start_engine(timed_engine(10, 50)).await;
    let sidecar = start_sidecar(engine, "").await;
    let response = post(sidecar.proxy_addr, "/v1/chat/completions", chat_body(100, true, false)).await;
    let mut body = response.into_body();
    // Read the role chunk and two content chunks, then hang up.
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(sample(&sidecar.metrics.encode(), "llmslo_requests_in_flight", &[]), 1.0);
    drop(body);
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_in_flight", &[]), 0.0);
    assert_eq!(
        sample(&m, "llmslo_requests_total", &with_outcome("client_cancelled")),
        1.0
    );
    assert_eq!(sample(&m, "llmslo_requests_total", &[]), 1.0);
}

#[tokio::test(start_paused = true)]
async fn non_streaming_requests_get_e2e_and_tokens_from_usage() {
    let (engine, _stop) = start_engine(timed_engine(100, 10)).await;
    let sidecar = start_sidecar(engine, "").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(11, false, false)).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["usage"]["completion_tokens"], 11);
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_output_tokens_total", CHAT), 11.0);
    assert_eq!(sample(&m, "llmslo_input_tokens_total", CHAT), 2.0);
    assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", CHAT), 0.0);
    assert_eq!(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_count", CHAT),
        0.0
    );
    let e2e = sample(&m, "gen_ai_server_request_duration_seconds_sum", CHAT);
    assert!((e2e - 0.200).abs() < 0.002, "e2e {e2e}");
}

#[tokio::test(start_paused = true)]
async fn histogram_counts_equal_request_counts() {
    let (engine, _stop) = start_engine(timed_engine(20, 5)).await;
    let sidecar = start_sidecar(engine, "").await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let addr = sidecar.proxy_addr;
        tasks.push(tokio::spawn(async move {
            post_collect(
                addr,
                "/v1/chat/completions",
                chat_body(2 + i % 5, i % 3 != 0, i % 2 == 0),
            )
            .await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().0, 200);
    }
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_total", &[]), 30.0);
    assert_eq!(sample(&m, "gen_ai_server_request_duration_seconds_count", &[]), 30.0);
    // Streamed requests (20 of 30) each have one TTFT and one TPOT.
    assert_eq!(sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &[]), 20.0);
    assert_eq!(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_count", &[]),
        20.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_streams_are_all_counted() {
    let (engine, _stop) = start_engine(timed_engine(50, 5)).await;
    let sidecar = start_sidecar(engine, "").await;
    let mut tasks = Vec::new();
    for _ in 0..250 {
        let addr = sidecar.proxy_addr;
        tasks.push(tokio::spawn(async move {
            post_collect(addr, "/v1/chat/completions", chat_body(20, true, true)).await
        }));
    }
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200);
        assert!(body.ends_with(b"data: [DONE]\n\n"));
    }
    let m = settled(&sidecar).await;
    assert_eq!(sample(&m, "llmslo_requests_total", &with_outcome("success")), 250.0);
    assert_eq!(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_count", CHAT),
        250.0
    );
    assert_eq!(sample(&m, "llmslo_output_tokens_total", CHAT), 250.0 * 20.0);
    assert_eq!(
        sample(&m, "llmslo_inter_chunk_latency_seconds_count", CHAT),
        250.0 * 19.0
    );
}
