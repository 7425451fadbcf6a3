//! What a user scrapes does not change when the code moves: a fixed mix of requests (chat,
//! completions, Responses and Messages, streamed and not, reasoning, an unknown model, an
//! embedding) against the simulated engine under paused time, with SLOs and the engine's page
//! merged, gives exactly the `/metrics` kept in `tests/fixtures/golden/`, in each of the three
//! formats. Only what is wall-clock time is masked (timestamps); every latency is exact under
//! paused time.
//!
//! After a deliberate change to what `/metrics` shows, regenerate the files with
//! `LLMSLO_BLESS=1 cargo test --test integration metrics_golden::` and review the diff.

use crate::common::*;
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use llmslo::tools::simulate::SimOptions;
use std::path::PathBuf;

const CONFIG: &str = "\
engine: vllm
engine_metrics: merge
service: golden
min_events: 1
slos:
  - {name: ttft-300ms, objective: 99, ttft: 300ms}
  - {name: tpot-10ms, objective: 99, tpot: 10ms}
  - {name: answer-1s, objective: 99, answer_ttft: 1s}
  - {name: e2e-2s, objective: 95, e2e: 2s}
  - {name: availability, objective: 99.9, availability: true}
goodput:
  require: [ttft-300ms, tpot-10ms]
";

/// The requests, in order: (route, body).
fn mix() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    let messages = json!([{"role": "user", "content": "Tell me a story."}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "sim", "messages": messages, "max_tokens": 12, "stream": true,
                   "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "sim", "messages": messages, "max_tokens": 9, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "sim", "messages": messages, "max_tokens": 5}),
        ),
        (
            "/v1/completions",
            json!({"model": "sim", "prompt": "Once", "max_tokens": 7, "stream": true}),
        ),
        (
            "/v1/responses",
            json!({"model": "sim", "input": "Tell me a story.", "max_output_tokens": 10, "stream": true}),
        ),
        (
            "/v1/responses",
            json!({"model": "sim", "input": "Tell me a story.", "max_output_tokens": 6}),
        ),
        (
            "/v1/messages",
            json!({"model": "sim", "messages": messages, "max_tokens": 11, "stream": true}),
        ),
        (
            "/v1/messages",
            json!({"model": "sim", "messages": messages, "max_tokens": 4}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "no-such-model", "messages": messages, "max_tokens": 4, "stream": true}),
        ),
        ("/v1/embeddings", json!({"model": "sim", "input": "Tell me a story."})),
    ]
}

/// `text` with every sample of a family named `*timestamp*` given the value 0.
fn masked(text: &str) -> String {
    text.lines()
        .map(|line| match line.rsplit_once(' ') {
            Some((series, _)) if !line.starts_with('#') && series.contains("timestamp") => format!("{series} 0"),
            _ => line.to_string(),
        })
        .map(|line| line + "\n")
        .collect()
}

/// Compares `actual` with the golden file `name`, or writes it with `LLMSLO_BLESS=1`.
fn golden(name: &str, actual: &[u8]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden")
        .join(name);
    if std::env::var_os("LLMSLO_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if expected != actual {
        let at = expected
            .iter()
            .zip(actual)
            .position(|(e, a)| e != a)
            .unwrap_or(expected.len().min(actual.len()));
        let around = |bytes: &[u8]| {
            String::from_utf8_lossy(&bytes[at.saturating_sub(120)..(at + 40).min(bytes.len())]).into_owned()
        };
        panic!(
            "{name} differs from the golden file at byte {at} (sizes {} and {}):\n\
             expected: …{:?}…\nactual:   …{:?}…",
            expected.len(),
            actual.len(),
            around(&expected),
            around(actual),
        );
    }
}

/// `/metrics` as a scraper asking with `accept` gets it.
async fn scrape(addr: std::net::SocketAddr, accept: &str) -> Vec<u8> {
    let request = Request::get(format!("http://{addr}/metrics"))
        .header(header::ACCEPT, accept)
        .body(Full::default())
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap().to_bytes().to_vec()
}

#[tokio::test(start_paused = true)]
async fn a_fixed_mix_of_requests_gives_the_same_metrics_page() {
    let options = SimOptions {
        reasoning_tokens: 2,
        per_request_metrics: true,
        ..timed_engine(120, 15)
    };
    let (engine, _stop) = start_engine(options).await;
    let sidecar = start_sidecar(engine, CONFIG).await;
    model_learned(&sidecar, "sim").await;
    for (route, body) in mix() {
        let (status, _) = post_collect(sidecar.proxy_addr, route, body.to_string()).await;
        assert!(status == 200 || status == 404, "{route}: {status}");
        settle(&sidecar).await;
    }
    // A scrape of the engine's page after the last request, so the merged families are settled.
    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    let addr = sidecar.metrics_addr;
    let openmetrics = scrape(addr, "application/openmetrics-text;version=1.0.0").await;
    let openmetrics = masked(std::str::from_utf8(&openmetrics).unwrap());
    assert!(openmetrics.contains("llmslo_slo_events_total"), "the SLOs are in force");
    assert!(openmetrics.contains("operation=\"messages\""), "every API was measured");
    assert!(openmetrics.contains("vllm:"), "the engine's page is merged");
    golden("metrics.openmetrics.txt", openmetrics.as_bytes());
    let classic = scrape(addr, "text/plain;version=0.0.4").await;
    golden(
        "metrics.classic.txt",
        masked(std::str::from_utf8(&classic).unwrap()).as_bytes(),
    );
    let protobuf = scrape(
        addr,
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
    )
    .await;
    golden("metrics.protobuf.bin", &in_label_order(&protobuf));
}

/// The protobuf exposition with each family's series in label order (they come in hash
/// order, as prometheus-client keeps them) and what is wall-clock time (start timestamps, the
/// `*timestamp*` gauges) masked,
/// re-encoded.
fn in_label_order(mut bytes: &[u8]) -> Vec<u8> {
    use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::MetricFamily;
    use prost::Message;
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut family = MetricFamily::decode_length_delimited(&mut bytes).unwrap();
        let wall_clock = family.name.contains("timestamp");
        for metric in &mut family.metric {
            if let Some(gauge) = metric.gauge.as_mut().filter(|_| wall_clock) {
                gauge.value = 0.0;
            }
            if let Some(counter) = &mut metric.counter {
                counter.start_timestamp = None;
            }
            if let Some(histogram) = &mut metric.histogram {
                histogram.start_timestamp = None;
            }
        }
        family.metric.sort_by_key(|m| format!("{:?}", m.label));
        family.encode_length_delimited(&mut out).unwrap();
    }
    out
}
