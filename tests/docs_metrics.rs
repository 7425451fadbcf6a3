//! Every metric name the README and the docs mention is one a running sidecar exports, so the
//! docs cannot name a metric that does not exist (or no longer does).

use crate::common;

use crate::common::*;
use std::collections::BTreeSet;
use std::time::Duration;

/// Every `llmslo_…` and `gen_ai_…` name in the README and docs/*.md. A name written as a
/// prefix (`llmslo_capacity_*`) ends in `_`.
fn documented_names() -> BTreeSet<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/README.md")];
    for entry in std::fs::read_dir(format!("{root}/docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path.display().to_string());
        }
    }
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (start, _) in text.match_indices("llmslo_").chain(text.match_indices("gen_ai_")) {
            let preceded = text[..start].chars().next_back();
            if preceded.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// The sample names of an exposition.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn every_metric_the_docs_name_is_exported() {
    let (engine, _stop) = start_engine(llmslo::tools::simulate::SimOptions {
        per_request_metrics: true,
        tokens_per_chunk: 2,
        ..timed_engine(5, 1)
    })
    .await;
    let keys = std::env::temp_dir().join(format!("llmslo-docs-keys-{}.yaml", std::process::id()));
    std::fs::write(&keys, "team-k: [sk-docs]\n").unwrap();
    let config = format!(
        "engine: vllm\nmin_events: 1\ngpu: {{simulated: true, processes: true, interval: 100ms}}\n\
         tenants: {{from: [{{header: x-team}}, {{api_keys: {}}}]}}\n\
         cost: {{gpu_hour_price: 2, slos: [{{name: out, cost_per_million_output_tokens: 1}}]}}\n{}",
        keys.display(),
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/llmslo.yaml"))
            .unwrap()
            .lines()
            .skip_while(|l| !l.starts_with("slos:"))
            .collect::<Vec<_>>()
            .join("\n")
            // One SLO every request misses, so that its bad events have causes.
            .replacen("slos:", "slos:\n  - {name: always-missed, objective: 99, ttft: 1ms}", 1)
    );
    let sidecar = start_sidecar(engine, &config).await;
    for (route, body) in [
        ("/v1/chat/completions", chat_body(4, true, true)),
        (
            "/v1/responses",
            serde_json::json!({"model": "sim", "input": "x", "max_output_tokens": 4, "stream": true}).to_string(),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model": "sim", "max_tokens": 4, "stream": true, "messages": []}).to_string(),
        ),
    ] {
        let (status, _) = post_collect(sidecar.proxy_addr, route, body).await;
        assert_eq!(status, 200, "{route}");
    }
    // A request that states a target of its own.
    let targeted = http::Request::post(format!("http://{}/v1/chat/completions", sidecar.proxy_addr))
        .header("content-type", "application/json")
        .header("x-llm-d-slo-ttft-ms", "1000")
        .body(http_body_util::Full::new(bytes::Bytes::from(chat_body(2, true, false))))
        .unwrap();
    let answer = client().request(targeted).await.unwrap();
    assert_eq!(answer.status(), 200);
    http_body_util::BodyExt::collect(answer.into_body()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // a GPU sample or two
    let mut exported = exported_names(&settled(&sidecar).await);
    for page in disaggregated_pages().await {
        exported.extend(exported_names(&page));
    }
    // A TLS port's certificate families.
    let tls = start_sidecar(sidecar.proxy_addr, "tls: {self_signed: true}\n").await;
    exported.extend(exported_names(&settled(&tls).await));
    tls.shutdown().await;
    let missing: Vec<String> = documented_names()
        .into_iter()
        .filter(|name| {
            !exported
                .iter()
                .any(|e| e == name || e.starts_with(&format!("{}_", name.trim_end_matches('_'))))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the docs name metrics llmslo does not export: {missing:?}"
    );
    sidecar.shutdown().await;
}

/// The pages of a prefill/decode pair after disaggregated requests: the front sidecar (role
/// decode, relaying the prefill legs), the prefill pod's, and one misplaced behind the routing
/// sidecar.
async fn disaggregated_pages() -> Vec<String> {
    let engine = || llmslo::tools::simulate::SimOptions {
        per_request_metrics: true,
        pd: Some(llmslo::tools::simulate::disagg::PdOptions {
            prefill_per_token: Duration::ZERO,
            transfer_per_token: Duration::ZERO,
        }),
        ..timed_engine(5, 1)
    };
    let (prefill_engine, _p) = start_engine(engine()).await;
    let (decode_engine, _d) = start_engine(engine()).await;
    let prefill = start_sidecar(prefill_engine, "role: prefill\n").await;
    let behind = start_sidecar(decode_engine, "").await;
    let router = common::routing::start_routing_sidecar(behind.proxy_addr).await;
    let front = start_sidecar(
        router,
        &format!(
            "role: decode\nprefill_relay: 127.0.0.1:{}\nprefill_pool: [{}]\nslos:\n  - {{name: ttft, objective: 99, ttft: 1ms}}\n",
            free_port(),
            prefill.proxy_addr
        ),
    )
    .await;
    // Five through the relay (enough for the misplaced sidecar's warning), and one naming an
    // address outside the pool, which the relay leaves to the routing sidecar.
    let outside = format!("127.0.0.1:{}", free_port());
    for named in std::iter::repeat_n(prefill.proxy_addr.to_string(), 5).chain([outside]) {
        let request = http::Request::post(format!("http://{}/v1/chat/completions", front.proxy_addr))
            .header("content-type", "application/json")
            .header("x-prefiller-host-port", &named)
            .body(http_body_util::Full::from(chat_body(4, true, false)))
            .unwrap();
        let response = client().request(request).await.unwrap();
        assert_eq!(response.status() == 200, named == prefill.proxy_addr.to_string());
        http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
    }
    let pages = vec![settled(&front).await, settled(&prefill).await, settled(&behind).await];
    for sidecar in [front, prefill, behind] {
        sidecar.shutdown().await;
    }
    pages
}
