//! Every engine's stream shape through the sidecar, with `engine: auto` identifying it:
//! TGI (native generate API and OpenAI routes), llama.cpp, vLLM with `n > 1` and reasoning.

use crate::common::*;
use http_body_util::BodyExt;
use llmslo::tools::simulate::shape::Flavor;
use llmslo::tools::simulate::SimOptions;

fn flavored(flavor: Flavor, ttft_ms: u64, tpot_ms: u64) -> SimOptions {
    SimOptions {
        flavor,
        ..timed_engine(ttft_ms, tpot_ms)
    }
}

fn tgi_request(max_new_tokens: u32) -> String {
    serde_json::json!({"inputs": "one two three", "parameters": {"max_new_tokens": max_new_tokens, "details": true}})
        .to_string()
}

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() < 0.0005
}

#[tokio::test(start_paused = true)]
async fn tgi_native_stream_is_measured_and_identified() {
    let (engine, _stop) = start_engine(flavored(Flavor::Tgi, 100, 10)).await;
    let sidecar = start_sidecar(engine, "engine: auto\n").await;
    assert_eq!(identified(&sidecar).await, "tgi");
    let generate = [("model", "sim"), ("operation", "generate"), ("provider", "tgi")];
    let m = sidecar.metrics.encode();
    assert!(
        !m.contains("operation=\"generate\""),
        "an API's series appear with its first request, not before"
    );

    let response = post(sidecar.proxy_addr, "/generate_stream", tgi_request(5)).await;
    assert_eq!(response.headers()["x-compute-type"], "gpu+optimized");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        body.starts_with(b"data:{"),
        "TGI's own framing (no space after `data:`) passes through"
    );
    assert!(!body.ends_with(b"[DONE]\n\n"));
    let m = settled(&sidecar).await;
    assert!(close(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &generate),
        0.100
    ));
    assert!(close(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_sum", &generate),
        0.010
    ));
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &generate),
        5.0,
        "from details.generated_tokens"
    );
    assert_eq!(
        sample(
            &m,
            "llmslo_requests_total",
            &[("operation", "generate"), ("outcome", "success")]
        ),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn tgi_non_streaming_generate_and_mid_stream_error() {
    let (engine, _stop) = start_engine(flavored(Flavor::Tgi, 10, 1)).await;
    let sidecar = start_sidecar(engine, "engine: tgi\n").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/generate", tgi_request(7)).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["details"]["generated_tokens"], 7);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &[("operation", "generate")]),
        7.0
    );
    assert_eq!(
        sample(
            &m,
            "gen_ai_server_time_to_first_token_seconds_count",
            &[("operation", "generate")]
        ),
        0.0
    );

    let failing = SimOptions {
        midstream_error_rate: 1.0,
        ..flavored(Flavor::Tgi, 10, 1)
    };
    let (engine, _stop) = start_engine(failing).await;
    let sidecar = start_sidecar(engine, "engine: tgi\n").await;
    let (status, body) = post_collect(sidecar.proxy_addr, "/generate_stream", tgi_request(6)).await;
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("incomplete_generation_stream"));
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_requests_total", &[("outcome", "upstream_error")]),
        1.0
    );
}

#[tokio::test(start_paused = true)]
async fn tgi_openai_route_has_no_role_only_chunk() {
    let (engine, _stop) = start_engine(flavored(Flavor::Tgi, 80, 10)).await;
    let sidecar = start_sidecar(engine, "engine: auto\n").await;
    assert_eq!(identified(&sidecar).await, "tgi");
    let (_, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(4, true, false)).await;
    let first = String::from_utf8_lossy(&body).split("\n\n").next().unwrap().to_string();
    assert!(
        first.contains("\"role\":\"assistant\"") && first.contains("\"content\":\" "),
        "{first}"
    );
    let m = settled(&sidecar).await;
    let chat = [("operation", "chat"), ("provider", "tgi")];
    assert!(close(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &chat),
        0.080
    ));
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &chat), 4.0);
}

#[tokio::test(start_paused = true)]
async fn llamacpp_sends_no_usage_so_the_count_and_tpot_are_unknown() {
    let (engine, _stop) = start_engine(flavored(Flavor::Llamacpp, 50, 20)).await;
    let sidecar = start_sidecar(engine, "engine: auto\n").await;
    assert_eq!(identified(&sidecar).await, "llamacpp");
    // Usage is asked for (injected), none arrives: nothing is removed, and with no tokenizer
    // configured N is unknown (an event may hold several tokens).
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(6, true, false)).await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("\"created\": "), "spaced separators pass through: {text}");
    assert!(text.contains("\"content\": null"));
    assert_eq!(text.matches("data: ").count(), 1 + 6 + 1, "role, six tokens, [DONE]");
    let m = settled(&sidecar).await;
    let chat = [("operation", "chat"), ("provider", "llamacpp")];
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &chat), 0.0);
    assert_eq!(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_count", &chat),
        0.0
    );
    assert_eq!(
        sample(&m, "llmslo_token_count_source_total", &[("source", "events")]),
        1.0
    );
    assert_eq!(
        sample(&m, "llmslo_inter_chunk_latency_seconds_count", &chat),
        5.0,
        "gaps need no count"
    );
    assert!(close(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &chat),
        0.050
    ));
}

#[tokio::test(start_paused = true)]
async fn n_choices_are_timed_per_choice() {
    let (engine, _stop) = start_engine(timed_engine(60, 15)).await;
    let sidecar = start_sidecar(engine, "engine: auto\n").await;
    assert_eq!(identified(&sidecar).await, "vllm");
    let body = serde_json::json!({
        "model": "sim", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "n": 2, "stream": true,
    });
    let (status, received) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", body.to_string()).await;
    assert_eq!(status, 200);
    assert!(
        !String::from_utf8_lossy(&received).contains("\"usage\""),
        "the injected usage stays hidden"
    );
    let m = settled(&sidecar).await;
    let chat = [("operation", "chat"), ("provider", "vllm")];
    assert_eq!(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &chat),
        1.0,
        "one TTFT per request"
    );
    assert_eq!(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_count", &chat),
        2.0,
        "one TPOT per choice"
    );
    assert!(close(
        sample(&m, "gen_ai_server_time_per_output_token_seconds_sum", &chat),
        0.030
    ));
    assert_eq!(
        sample(&m, "llmslo_inter_chunk_latency_seconds_count", &chat),
        8.0,
        "four gaps per choice"
    );
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &chat),
        10.0,
        "usage counts both choices"
    );
}

#[tokio::test(start_paused = true)]
async fn reasoning_deltas_are_the_first_tokens() {
    let options = SimOptions {
        reasoning_tokens: 3,
        ..timed_engine(120, 10)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, "").await;
    let (_, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(6, true, true)).await;
    let text = String::from_utf8_lossy(&body);
    assert_eq!(text.matches("reasoning_content").count(), 3);
    let m = settled(&sidecar).await;
    let chat = [("operation", "chat")];
    assert!(close(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_sum", &chat),
        0.120
    ));
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &chat), 6.0);
}

fn json_script(status: &str, body: &str) -> Script {
    Script {
        head: format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}",
            body.len()
        ),
        pieces: vec![(std::time::Duration::ZERO, body.as_bytes().to_vec())],
        ..Script::sse(Vec::new())
    }
}

#[tokio::test(start_paused = true)]
async fn tgi_without_models_route_is_identified_by_its_info() {
    let (upstream, _) = scripted_upstream_by(|request| {
        if request.starts_with(b"GET /v1/models ") {
            json_script("404 Not Found", r#"{"error":"not found"}"#)
        } else if request.starts_with(b"GET /info ") {
            json_script(
                "200 OK",
                r#"{"model_id":"bigscience/bloom","router":"text-generation-router"}"#,
            )
        } else {
            json_script("200 OK", "{}")
        }
    })
    .await;
    let sidecar = start_sidecar(upstream, "engine: auto\n").await;
    assert_eq!(identified(&sidecar).await, "tgi");
}

#[tokio::test(start_paused = true)]
async fn an_engine_that_says_nothing_stays_unknown_until_it_does() {
    let (upstream, _) = scripted_upstream(json_script("404 Not Found", "{}")).await;
    let sidecar = start_sidecar(upstream, "engine: auto\nhealth_interval: 1s\n").await;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(sidecar.recorder.provider(), "unknown");
    let m = sidecar.metrics.encode();
    assert!(
        !m.contains("provider=\"unknown\""),
        "no series are pre-created for an unknown engine"
    );
}
