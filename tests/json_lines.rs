//! A reader added from outside: `examples/json_lines.rs` writes one JSON line per finished
//! request beside llmslo's own readers, with the exact figures `/metrics` counts, and adding
//! it changes nothing else.

#[allow(dead_code)] // the example's `main`
#[path = "../examples/json_lines.rs"]
mod example;

use crate::common::*;
use llmslo::config::Config;
use llmslo::sidecar::Sidecar;
use serde_json::Value;
use std::sync::Arc;

#[tokio::test(start_paused = true)]
async fn every_request_is_one_line_with_its_exact_figures() {
    let path = std::env::temp_dir().join(format!("llmslo-json-lines-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let (engine, _stop) = start_engine(timed_engine(120, 15)).await;
    let config = Config::from_yaml(&format!(
        "upstream: http://{engine}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\nengine: vllm\nfinal_scrape_grace: 0s\n"
    ))
    .unwrap();
    let lines = Arc::new(example::JsonLines::append_to(&path).unwrap());
    let sidecar = Sidecar::start_with(&config, vec![lines]).await.unwrap();
    model_learned(&sidecar, "sim").await;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(9, true, true)).await;
    assert_eq!(status, 200);
    let messages = serde_json::json!({"model": "sim", "max_tokens": 5, "stream": true,
                                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/messages", messages.to_string()).await;
    assert_eq!(status, 200);
    let unknown = chat_body(3, true, true).replace("\"sim\"", "\"no-such-model\"");
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", unknown).await;
    assert_eq!(status, 404);
    let metrics = settled(&sidecar).await;

    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "one line per request:\n{text}");
    let (chat, messages, unknown) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(
        (&chat["model"], &chat["operation"], &chat["provider"], &chat["outcome"]),
        (
            &Value::from("sim"),
            &Value::from("chat"),
            &Value::from("vllm"),
            &Value::from("success")
        )
    );
    assert_eq!(chat["ttft_s"], 0.12);
    assert_eq!(chat["tpot_s"], 0.015);
    assert_eq!(chat["output_tokens"], 9);
    assert_eq!(chat["token_count_source"], "usage");
    assert_eq!(chat["tpot_basis"], "stream");
    assert_eq!(
        (&messages["operation"], &messages["tpot_s"]),
        (&Value::from("messages"), &Value::from(0.015))
    );
    assert_eq!(
        (&unknown["model"], &unknown["outcome"]),
        (&Value::from("other"), &Value::from("client_error")),
        "the client's model name is not written, only its bounded label"
    );
    // The line's figures are /metrics' figures.
    let labels = [("operation", "chat"), ("model", "sim")];
    assert_eq!(
        sample(&metrics, "gen_ai_server_time_to_first_token_seconds_sum", &labels),
        0.12
    );
    assert_eq!(
        sample(&metrics, "llmslo_requests_total", &[("outcome", "client_error")]),
        1.0
    );
    sidecar.shutdown().await;
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_file_that_cannot_be_opened_is_a_clear_error() {
    let error = example::JsonLines::append_to(std::path::Path::new("/nonexistent-dir/requests.jsonl"))
        .err()
        .expect("no such directory");
    assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
}
