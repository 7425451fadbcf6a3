//! The built-in simulated engine on its own: vLLM-shaped streams and answers.

use crate::common::*;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use llmslo::tools::simulate::SimOptions;
use serde_json::Value;

fn events(body: &[u8]) -> Vec<String> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is a data line")
                .to_string()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn chat_stream_has_the_vllm_shape() {
    let (engine, _stop) = start_engine(timed_engine(10, 1)).await;
    let (status, body) = post_collect(engine, "/v1/chat/completions", chat_body(3, true, true)).await;
    assert_eq!(status, 200);
    let events = events(&body);
    assert_eq!(events.len(), 1 + 3 + 1 + 1, "role, three tokens, usage, [DONE]");
    let json: Vec<Value> = events[..5].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(
        json[0]["choices"][0]["delta"],
        serde_json::json!({"role": "assistant", "content": ""})
    );
    for chunk in &json[1..4] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(!chunk["choices"][0]["delta"]["content"].as_str().unwrap().is_empty());
    }
    assert_eq!(json[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(json[4]["choices"], serde_json::json!([]));
    assert_eq!(json[4]["usage"]["completion_tokens"], 3);
    assert_eq!(json[4]["usage"]["prompt_tokens"], 2);
    assert_eq!(events[5], "[DONE]");
}

#[tokio::test(start_paused = true)]
async fn usage_only_when_asked_and_tokens_per_chunk_honoured() {
    let options = SimOptions {
        tokens_per_chunk: 3,
        ..timed_engine(1, 1)
    };
    let (engine, _stop) = start_engine(options).await;
    let (_, body) = post_collect(engine, "/v1/chat/completions", chat_body(7, true, false)).await;
    let events = events(&body);
    assert_eq!(
        events.len(),
        1 + 3 + 1,
        "role, chunks of 3+3+1 tokens, [DONE]; no usage"
    );
    let words = |e: &str| {
        let v: Value = serde_json::from_str(e).unwrap();
        v["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count()
    };
    assert_eq!([words(&events[1]), words(&events[2]), words(&events[3])], [3, 3, 1]);
}

#[tokio::test(start_paused = true)]
async fn completions_and_non_streaming_answers() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let body = serde_json::json!({"model": "sim", "prompt": "x", "max_tokens": 2, "stream": true}).to_string();
    let (_, stream) = post_collect(engine, "/v1/completions", body).await;
    let events = events(&stream);
    assert_eq!(events.len(), 3, "no role chunk for completions");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "text_completion");
    let (status, whole) = post_collect(engine, "/v1/chat/completions", chat_body(4, false, false)).await;
    assert_eq!(status, 200);
    let whole: Value = serde_json::from_slice(&whole).unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["usage"]["completion_tokens"], 4);
    assert_eq!(
        whole["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        4
    );
}

#[tokio::test]
async fn models_health_and_errors() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let get = |path: &str| {
        Request::get(format!("http://{engine}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let models = client().request(get("/v1/models")).await.unwrap();
    let models: Value = serde_json::from_slice(&models.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(models["data"][0]["id"], "sim");
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    assert_eq!(client().request(get("/health")).await.unwrap().status(), 200);
    assert_eq!(client().request(get("/nope")).await.unwrap().status(), 404);

    let (status, body) = post_collect(engine, "/v1/chat/completions", r#"{"model":"gpt-9"}"#.into()).await;
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("The model `gpt-9` does not exist."));
    let (status, _) = post_collect(
        engine,
        "/v1/chat/completions",
        r#"{"model":"sim","max_tokens":0}"#.into(),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = post_collect(engine, "/v1/chat/completions", "not json".into()).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_metrics_page_counts_the_streams_being_generated() {
    let (engine, _stop) = start_engine(timed_engine(5, 100)).await;
    let running = || async move {
        let request = Request::get(format!("http://{engine}/metrics"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let page = client()
            .request(request)
            .await
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap();
        let page = String::from_utf8(page.to_bytes().to_vec()).unwrap();
        assert!(
            page.contains("vllm:num_requests_waiting{model_name=\"sim\"} 0.0"),
            "{page}"
        );
        sample(&page, "vllm:num_requests_running", &[])
    };
    assert_eq!(running().await, 0.0);
    let stream = client()
        .request(
            Request::post(format!("http://{engine}/v1/chat/completions"))
                .body(Full::new(Bytes::from(chat_body(50, true, false))))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(running().await, 1.0, "one stream is being generated");
    drop(stream);
    for _ in 0..100 {
        if running().await == 0.0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the stream never ended on the page");
}

/// The stamps of the token-carrying events of one streamed request, as a client sees them.
async fn token_stamps(engine: std::net::SocketAddr, tokens: u32) -> Vec<tokio::time::Instant> {
    let response = post(engine, "/v1/chat/completions", chat_body(tokens, true, false)).await;
    let mut body = response.into_body();
    let mut stamps = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        let Some(data) = frame.data_ref() else { continue };
        let text = String::from_utf8_lossy(data);
        for event in text.split("\n\n").filter(|e| e.contains("\"content\":\" ")) {
            let _ = event;
            stamps.push(tokio::time::Instant::now());
        }
    }
    stamps
}

#[tokio::test(start_paused = true)]
async fn batching_tpot_is_the_step_model_at_every_concurrency() {
    use llmslo::tools::simulate::batching::BatchingOptions;
    use std::time::Duration;
    let batching = BatchingOptions {
        step_base: Duration::from_millis(10),
        step_per_seq: Duration::from_micros(500),
        prefill_per_token: Duration::ZERO,
        max_batch: 64,
        kv_tokens: None,
        step_jitter: 0.0,
    };
    for clients in [1u32, 8, 64] {
        let (engine, stop) = start_engine(SimOptions {
            batching: Some(batching),
            ..SimOptions::default()
        })
        .await;
        let expected = 10.0 + 0.5 * f64::from(clients);
        let tasks: Vec<_> = (0..clients)
            .map(|_| {
                tokio::spawn(async move {
                    let mut tpots = Vec::new();
                    for _ in 0..3 {
                        let stamps = token_stamps(engine, 32).await;
                        assert_eq!(stamps.len(), 32);
                        let span = (stamps[31] - stamps[0]).as_secs_f64() * 1e3;
                        tpots.push(span / 31.0);
                    }
                    tpots
                })
            })
            .collect();
        for task in tasks {
            for tpot in task.await.unwrap() {
                let off = (tpot - expected).abs() / expected;
                assert!(
                    off <= 0.02,
                    "{clients} clients: TPOT {tpot:.3} ms against {expected} ms"
                );
            }
        }
        stop.cancel();
    }
}

/// What the simulator answers on `path` (`GET` for the read-only routes, else a small `POST`).
async fn answers(engine: std::net::SocketAddr, path: &str) -> bool {
    let get = matches!(path, "/health" | "/metrics" | "/v1/models" | "/info");
    let request = if get {
        Request::get(format!("http://{engine}{path}")).body(Full::new(Bytes::new()))
    } else {
        let body = r#"{"model":"sim","prompt":"hi","input":"hi","inputs":"hi","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}"#;
        Request::post(format!("http://{engine}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
    };
    let response = client().request(request.unwrap()).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status != http::StatusCode::NOT_FOUND
}

#[tokio::test(start_paused = true)]
async fn the_docs_name_exactly_the_routes_the_simulator_serves() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
    let sentence = &docs[docs.find("`simulate` serves").expect("the routes sentence")..];
    let sentence = &sentence[..sentence.find(" with vLLM-shaped").unwrap()].replace('\n', " ");
    let (vllm, tgi) = sentence.split_once("`--flavor tgi`").unwrap();
    let paths = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .filter(|p| p.starts_with('/'))
            .map(str::to_string)
            .collect()
    };
    let candidates = [
        "/health",
        "/metrics",
        "/v1/models",
        "/info",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/generate",
        "/generate_stream",
        "/pooling",
        "/classify",
        "/score",
        "/rerank",
        "/v1/audio/transcriptions",
    ];
    for (flavor, documented) in [
        (llmslo::tools::simulate::shape::Flavor::Vllm, paths(vllm)),
        (
            llmslo::tools::simulate::shape::Flavor::Tgi,
            [paths(vllm), paths(tgi)].concat(),
        ),
    ] {
        let (engine, stop) = start_engine(SimOptions {
            flavor,
            ..timed_engine(1, 1)
        })
        .await;
        let mut served = Vec::new();
        for path in candidates {
            if answers(engine, path).await {
                served.push(path.to_string());
            }
        }
        let mut documented = documented.clone();
        documented.sort();
        served.sort();
        assert_eq!(documented, served, "{flavor:?}");
        stop.cancel();
    }
}
