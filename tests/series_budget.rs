//! The series a pod exports, held to the budget docs/metrics.md states: after chat-only
//! traffic, one model and three SLOs fit in the engine's own page (400 classic series, 200 with
//! native histograms), and three models, three SLOs and twenty tenants in 2,000 classic and
//! 1,500 native. Counted as Prometheus stores them: every line of the text page; on the
//! protobuf page a histogram is one series (native histograms, classic buckets not kept).

use crate::common::*;
use llmslo::proto::MetricFamily;
use serde_json::json;

/// The three SLOs of the README's kind, goodput judged by the two latency ones.
const SLOS: &str = "service: chat\nslos:\n  - {name: ttft-500ms, objective: 99, ttft: 500ms}\n  \
                    - {name: tpot-50ms, objective: 99, tpot: 50ms}\n  \
                    - {name: availability, objective: 99.9, availability: true}\n\
                    goodput: {require: [ttft-500ms, tpot-50ms]}\n";

/// Series on the text page (every sample line) and on the protobuf page with each histogram
/// counted once.
fn series(sidecar: &llmslo::sidecar::Sidecar) -> (usize, usize) {
    let classic = sidecar.metrics.encode().lines().filter(|l| !l.starts_with('#')).count();
    let mut bytes = &sidecar.metrics.encode_protobuf()[..];
    let mut native = 0;
    while !bytes.is_empty() {
        let family = <MetricFamily as prost::Message>::decode_length_delimited(&mut bytes).unwrap();
        native += family.metric.len();
    }
    (classic, native)
}

/// Streams two chat requests for each of `models` as each of `tenants` (none: no header).
async fn chat_traffic(sidecar: &llmslo::sidecar::Sidecar, models: &[&str], tenants: &[String]) {
    let tenants: Vec<Option<&str>> = if tenants.is_empty() {
        vec![None]
    } else {
        tenants.iter().map(|t| Some(t.as_str())).collect()
    };
    for model in models {
        model_learned(sidecar, model).await;
        for tenant in &tenants {
            for _ in 0..2 {
                let body = json!({"model": model, "max_tokens": 4, "stream": true,
                                  "stream_options": {"include_usage": true},
                                  "messages": [{"role": "user", "content": "hi"}]});
                let mut request = http::Request::post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
                    .header("content-type", "application/json");
                if let Some(tenant) = tenant {
                    request = request.header("x-team", *tenant);
                }
                let request = request.body(http_body_util::Full::from(body.to_string())).unwrap();
                let response = client().request(request).await.unwrap();
                assert_eq!(response.status(), 200);
                http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
            }
        }
    }
    settle(sidecar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_model_and_three_slos_fit_in_the_engines_own_page() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, &format!("engine: vllm\n{SLOS}")).await;
    chat_traffic(&sidecar, &["sim"], &[]).await;
    let (classic, native) = series(&sidecar);
    eprintln!("one model, three SLOs: {classic} classic series, {native} native");
    assert!(
        classic <= 400,
        "{classic} classic series:\n{}",
        sidecar.metrics.encode()
    );
    assert!(native <= 200, "{native} series with native histograms");
    sidecar.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_models_three_slos_and_twenty_tenants_fit_in_two_thousand() {
    let (engine, _stop) = start_engine(llmslo::tools::simulate::SimOptions {
        models: vec!["m1".into(), "m2".into(), "m3".into()],
        ..timed_engine(1, 1)
    })
    .await;
    let sidecar = start_sidecar(
        engine,
        &format!("engine: vllm\n{SLOS}tenants:\n  from: [{{header: x-team}}]\n"),
    )
    .await;
    let tenants: Vec<String> = (1..=20).map(|i| format!("team-{i:02}")).collect();
    chat_traffic(&sidecar, &["m1", "m2", "m3"], &tenants).await;
    let page = sidecar.metrics.encode();
    for tenant in &tenants {
        assert!(page.contains(&format!("tenant=\"{tenant}\"")), "{tenant} is counted");
    }
    let (classic, native) = series(&sidecar);
    eprintln!("three models, three SLOs, twenty tenants: {classic} classic series, {native} native");
    assert!(classic <= 2000, "{classic} classic series");
    assert!(native <= 1500, "{native} series with native histograms");
    sidecar.shutdown().await;
}
