//! Exact token counts and TPOT in every stream shape, against scripted engines whose truth is
//! known: several tokens per chunk (`--stream-interval`, speculative decoding), `n > 1`, no
//! usage (with and without per-event counts or a tokenizer), llama.cpp's empty final event,
//! and an engine without `/health`.

use crate::common::*;
use std::time::Duration;

const CHAT: &str = "/v1/chat/completions";
/// Each choice: six events of four tokens, 40 ms apart: 24 tokens over 200 ms.
const EVENTS: u64 = 6;
const PER_EVENT: u64 = 4;
const GAP_MS: u64 = 40;

/// The truth: (t_last − t_first) / (N − 1) for one choice.
fn true_tpot() -> f64 {
    ((EVENTS - 1) * GAP_MS) as f64 / 1000.0 / (EVENTS * PER_EVENT - 1) as f64
}

/// A chat stream of `choices` interleaved choices, each event four tokens; `token_ids` says
/// whether events state their counts; `usage` adds the usage chunk with the total.
fn four_token_chunks(choices: u32, token_ids: bool, usage: bool) -> Script {
    let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    let mut pieces = vec![(Duration::ZERO, role.as_bytes().to_vec())];
    for event in 0..EVENTS {
        for choice in 0..choices {
            let ids = if token_ids { ",\"token_ids\":[1,2,3,4]" } else { "" };
            let chunk = format!(
                "data: {{\"choices\":[{{\"index\":{choice},\"delta\":{{\"content\":\" tok en tok en\"}}{ids}}}]}}\n\n"
            );
            let delay = if event == 0 && choice == 0 {
                100
            } else if choice == 0 {
                GAP_MS
            } else {
                0
            };
            pieces.push((Duration::from_millis(delay), chunk.into_bytes()));
        }
    }
    if usage {
        let total = EVENTS * PER_EVENT * u64::from(choices);
        let chunk =
            format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{total}}}}}\n\n");
        pieces.push((Duration::from_millis(1), chunk.into_bytes()));
    }
    pieces.push((Duration::ZERO, b"data: [DONE]\n\n".to_vec()));
    Script::sse(pieces)
}

/// Streams one chat request through a sidecar with `extra` config in front of `script`;
/// returns the metrics.
async fn measure(script: Script, extra: &str, n: u32) -> String {
    let (upstream, _) = scripted_upstream(script).await;
    let sidecar = start_sidecar(upstream, extra).await;
    let body = serde_json::json!({"model": "m", "stream": true, "n": n, "messages": []}).to_string();
    let (status, _) = post_collect(sidecar.proxy_addr, CHAT, body).await;
    assert_eq!(status, 200);
    settled(&sidecar).await
}

fn tpots(m: &str) -> (f64, f64) {
    (
        sample(m, "gen_ai_server_time_per_output_token_seconds_count", &[]),
        sample(m, "gen_ai_server_time_per_output_token_seconds_sum", &[]),
    )
}

fn source(m: &str, source: &str) -> f64 {
    sample(m, "llmslo_token_count_source_total", &[("source", source)])
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() < 1e-6, "{what}: {got} against the truth {want}");
}

#[tokio::test(start_paused = true)]
async fn n2_with_four_token_chunks_splits_the_usage_total_per_choice() {
    let m = measure(four_token_chunks(2, false, true), "", 2).await;
    let (count, sum) = tpots(&m);
    assert_eq!(count, 2.0, "one TPOT per choice");
    assert_close(sum / 2.0, true_tpot(), "per-choice TPOT");
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[]), 48.0);
    assert_close(sample(&m, "llmslo_tokens_per_chunk_sum", &[]), 4.0, "tokens per chunk");
    assert_eq!(source(&m, "usage"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn without_usage_only_stated_counts_are_published() {
    // Nothing states the count: the TPOT would be four times too high, so there is none.
    let m = measure(four_token_chunks(1, false, false), "inject_usage: false\n", 1).await;
    assert_eq!(tpots(&m).0, 0.0);
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[]), 0.0);
    assert_eq!(
        sample(&m, "llmslo_tokens_per_chunk_count", &[]),
        0.0,
        "no 1.0 that hides it"
    );
    assert_eq!(source(&m, "events"), 1.0);
    assert_eq!(
        sample(&m, "gen_ai_server_time_to_first_token_seconds_count", &[]),
        1.0,
        "TTFT needs no count"
    );

    // Every event states its tokens: exact.
    let m = measure(four_token_chunks(1, true, false), "inject_usage: false\n", 1).await;
    let (count, sum) = tpots(&m);
    assert_eq!(count, 1.0);
    assert_close(sum, true_tpot(), "TPOT from token_ids");
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[]), 24.0);
    assert_eq!(source(&m, "token_ids"), 1.0);

    // The model's tokenizer counts the text: " tok en tok en" is four tokens.
    let tokenizer = format!(
        "inject_usage: false\ntokenizer: {}/tests/fixtures/tokenizer\n",
        env!("CARGO_MANIFEST_DIR")
    );
    let m = measure(four_token_chunks(2, false, false), &tokenizer, 2).await;
    let (count, sum) = tpots(&m);
    assert_eq!(count, 2.0);
    assert_close(sum / 2.0, true_tpot(), "TPOT from the tokenizer");
    assert_eq!(sample(&m, "llmslo_output_tokens_total", &[]), 48.0);
    assert_eq!(source(&m, "tokenizer"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn llamacpps_empty_final_event_is_not_a_token() {
    // Eight one-token completions events 30 ms apart, then llama.cpp's finish-only event.
    let mut pieces = Vec::new();
    for i in 0..8 {
        let chunk =
            "data: {\"choices\":[{\"text\":\" tok\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}]}\n\n";
        pieces.push((
            Duration::from_millis(if i == 0 { 50 } else { 30 }),
            chunk.as_bytes().to_vec(),
        ));
    }
    let last = "data: {\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n";
    pieces.push((Duration::from_millis(30), last.as_bytes().to_vec()));
    pieces.push((Duration::ZERO, b"data: [DONE]\n\n".to_vec()));
    let (upstream, _) = scripted_upstream(Script::sse(pieces)).await;
    let tokenizer = format!(
        "engine: llamacpp\ntokenizer: {}/tests/fixtures/tokenizer\n",
        env!("CARGO_MANIFEST_DIR")
    );
    let sidecar = start_sidecar(upstream, &tokenizer).await;
    let body = r#"{"model":"m","prompt":"x","stream":true}"#;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/completions", body.into()).await;
    assert_eq!(status, 200);
    let m = settled(&sidecar).await;
    assert_eq!(
        sample(&m, "llmslo_output_tokens_total", &[]),
        8.0,
        "eight tokens, not nine"
    );
    assert_eq!(sample(&m, "llmslo_inter_chunk_latency_seconds_count", &[]), 7.0);
    assert_close(
        tpots(&m).1,
        0.030,
        "TPOT ends at the last token, not at the finish event",
    );
}

#[tokio::test]
async fn an_engine_without_health_is_ready_through_its_model_list() {
    let models = r#"{"object":"list","data":[{"id":"m","object":"model","owned_by":"me","permissions":[]}]}"#;
    let (upstream, _) = scripted_upstream_by(move |request| {
        if request.starts_with(b"GET /v1/models") {
            Script {
                head: format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}",
                    models.len()
                ),
                pieces: vec![(Duration::ZERO, models.as_bytes().to_vec())],
                ..Script::sse(Vec::new())
            }
        } else {
            Script {
                head: "HTTP/1.1 404 Not Found\r\ncontent-length: 0".to_string(),
                ..Script::sse(Vec::new())
            }
        }
    })
    .await;
    let sidecar = start_sidecar(upstream, "engine: auto\nhealth_interval: 100ms\n").await;
    assert_eq!(
        identified(&sidecar).await,
        "llamacpp",
        "llama-cpp-python's owned_by \"me\""
    );
    let url = format!("http://{}/readyz", sidecar.metrics_addr);
    let mut ready = false;
    for _ in 0..50 {
        let response = client()
            .request(http::Request::get(&url).body(Default::default()).unwrap())
            .await
            .unwrap();
        if response.status() == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "/readyz never came up in front of an engine without /health");
}
