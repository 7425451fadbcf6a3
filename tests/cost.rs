//! The cost of serving, through the sidecar against the simulated engine under paused time:
//! the pod's cost rate from its price, what a million tokens cost over each window from the
//! tokens the engine served, each tenant's share adding up to the whole, and the cost SLO's
//! standing.

use crate::common::*;
use serde_json::json;
use std::time::Duration;

fn chat_for(tenant: &str, max_tokens: u32) -> (String, String) {
    let body = json!({"model": "sim", "max_tokens": max_tokens, "stream": true,
                      "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "Tell me a story, please."}]});
    (tenant.to_string(), body.to_string())
}

async fn send(addr: std::net::SocketAddr, tenant: &str, body: String) {
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-team", tenant)
        .body(http_body_util::Full::from(body))
        .unwrap();
    let response = client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_million_tokens_cost_what_the_pod_cost_over_the_tokens_it_served() {
    let (engine, _stop) = start_engine(timed_engine(50, 10)).await;
    let sidecar = start_sidecar(
        engine,
        "tenants:\n  from: [{header: x-team}]\n\
         cost:\n  gpu_hour_price: 3.6\n  gpus: 2\n  input_token_weight: 0.1\n  slos:\n    - {name: out-2, cost_per_million_output_tokens: 2.0}\n",
    )
    .await;
    model_learned(&sidecar, "sim").await;
    for (tenant, tokens) in [("a", 40), ("b", 10), ("a", 20), ("c", 30)] {
        let (tenant, body) = chat_for(tenant, tokens);
        send(sidecar.proxy_addr, &tenant, body).await;
    }
    let first = settled(&sidecar).await;
    tokio::time::advance(Duration::from_secs(60)).await;
    let m = sidecar.metrics.encode();
    // Two accelerators at 3.60 an hour: 7.20 an hour, 0.002 a second.
    assert_eq!(sample(&m, "llmslo_cost_per_hour", &[]), 7.2);
    let spent = sample(&m, "llmslo_cost_total", &[]) - sample(&first, "llmslo_cost_total", &[]);
    assert!((spent - 0.12).abs() < 1e-9, "a minute at 0.002 a second: {spent}");
    let cost = sample(&m, "llmslo_cost_over_window", &[("window", "5m")]);
    assert!(
        (cost - sample(&m, "llmslo_cost_total", &[])).abs() < 1e-9,
        "the uptime is shorter than 5m"
    );
    let output = sample(&m, "llmslo_output_tokens_total", &[]);
    let input = sample(&m, "llmslo_input_tokens_total", &[]);
    assert_eq!(output, 100.0);
    let per_million = sample(&m, "llmslo_cost_per_million_output_tokens", &[("window", "5m")]);
    let expected = cost * 1e6 / (output + 0.1 * input);
    assert!(
        (per_million - expected).abs() < 1e-9 * expected,
        "{per_million} vs {expected}"
    );
    let per_million_input = sample(&m, "llmslo_cost_per_million_input_tokens", &[("window", "5m")]);
    assert!((per_million_input - 0.1 * expected).abs() < 1e-9 * expected);
    // Conservation: the tenants' shares add up to the whole.
    let shares: Vec<f64> = ["a", "b", "c"]
        .iter()
        .map(|t| sample(&m, "llmslo_cost_tenant_share_ratio", &[("tenant", t), ("window", "5m")]))
        .collect();
    let total: f64 = shares.iter().sum();
    assert!((total - 1.0).abs() < 0.01, "{shares:?}");
    let weighted_a = sample(&m, "llmslo_output_tokens_total", &[("tenant", "a")])
        + 0.1 * sample(&m, "llmslo_input_tokens_total", &[("tenant", "a")]);
    assert!((shares[0] - weighted_a / (output + 0.1 * input)).abs() < 1e-9);
    let slo = sample(&m, "llmslo_cost_slo_ratio", &[("slo", "out-2"), ("window", "5m")]);
    assert!((slo - per_million / 2.0).abs() < 1e-9, "measured over target");
    sidecar.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_price_there_is_no_cost_family() {
    let (engine, _stop) = start_engine(timed_engine(50, 10)).await;
    let sidecar = start_sidecar(engine, "").await;
    let m = sidecar.metrics.encode();
    assert!(!m.contains("llmslo_cost"), "{m}");
    sidecar.shutdown().await;
}

#[test]
fn cost_config_errors_name_their_key() {
    for (yaml, key) in [
        ("cost: {gpu_hour_price: -1}\n", "cost.gpu_hour_price"),
        ("cost: {gpu_hour_price: 1, gpus: 0}\n", "cost.gpus"),
        (
            "cost: {gpu_hour_price: 1, input_token_weight: 0}\n",
            "cost.input_token_weight",
        ),
        (
            "cost: {slos: [{name: x, cost_per_million_output_tokens: 1}]}\n",
            "cost.gpu_hour_price",
        ),
        ("cost: {gpu_hour_price: 1, slos: [{name: x}]}\n", "cost.slos[0]"),
        (
            "cost: {gpu_hour_price: 1, slos: [{name: x, cost_per_million_input_tokens: 0}]}\n",
            "cost.slos[0].cost_per_million_input_tokens",
        ),
    ] {
        let error = llmslo::config::Config::from_yaml(&format!("upstream: http://127.0.0.1:1\n{yaml}")).unwrap_err();
        assert_eq!(error.key(), Some(key), "{error}");
    }
}
