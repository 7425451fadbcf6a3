//! End to end with a real Prometheus (Debian's 2.42, which `.ci/run` installs): the built-in
//! engine fails 30% of requests, the sidecar measures them, Prometheus scrapes it every second
//! and evaluates the rules `llmslo rules` generates. The fleet-level recording rule must agree
//! with the sidecar's own gauge, and the page alert must go pending or firing.

use crate::common::*;
use llmslo::sidecar::Sidecar;
use llmslo::slo::rules::{self, RulesFormat};
use std::time::{Duration, Instant};

/// Agreement asked of the two error ratios: Prometheus's comes from rate() over the few
/// scrapes it has, the sidecar's from its exact window; both see the same 30% failure rate.
const TOLERANCE: f64 = 0.05;

fn gauge(sidecar: &Sidecar, slo: &str, window: &str) -> f64 {
    sample(
        &sidecar.metrics.encode(),
        "llmslo_slo_error_ratio",
        &[("slo", slo), ("window", window), ("model", "sim")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn prometheus_rules_agree_with_the_sidecar_and_the_page_fires() {
    let Some(binary) = prometheus::binary() else {
        return; // only outside CI, which installs it (.ci/run)
    };
    let (sidecar, config, _engine) = prometheus::failing_engine_and_sidecar(1, "").await;

    let dir = std::env::temp_dir().join(format!("llmslo-prometheus-{}", std::process::id()));
    let server = prometheus::start(
        &binary,
        &dir,
        sidecar.metrics_addr,
        &rules::render(&config.slos, RulesFormat::Prometheus, rules::Scope::All),
        "",
    );

    // Steady traffic: eight clients back to back, 30% of requests failing.
    let load = prometheus::Load::start(sidecar.proxy_addr, chat_body(4, true, false));

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut agreed = None;
    let mut last_recorded = None;
    let mut alert_state = None;
    while Instant::now() < deadline && (agreed.is_none() || alert_state.is_none()) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let recorded = server
            // The model's own series: requests that came before the engine named its model are
            // `other` (and, failed, never learned), a ratio of their own.
            .query("slo:sli_error:ratio_rate5m{sloth_slo=\"availability\", model=\"sim\"}")
            .await;
        if let Some(value) = recorded
            .first()
            .and_then(|r| r["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok())
        {
            let own = gauge(&sidecar, "availability", "5m");
            last_recorded = Some((value, own));
            if (value - own).abs() <= TOLERANCE {
                agreed = Some((value, own));
            }
        }
        let alerts = server.api("/api/v1/alerts").await;
        alert_state = alerts["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["labels"]["alertname"] == "LLMSLOErrorBudgetBurnFast" && a["labels"]["slo"] == "availability")
            .map(|a| a["state"].as_str().unwrap_or_default().to_string());
    }
    load.stop().await;

    let (recorded, own) = agreed.unwrap_or_else(|| {
        panic!(
            "the recording rule never agreed with the sidecar's gauge: Prometheus has {:?}\n{}",
            last_recorded,
            sidecar.metrics.encode()
        )
    });
    assert!(
        (0.2..0.4).contains(&recorded),
        "the engine fails 30% of requests: {recorded}"
    );
    eprintln!("slo:sli_error:ratio_rate5m = {recorded:.4}, llmslo_slo_error_ratio = {own:.4}");
    let state = alert_state.expect("LLMSLOErrorBudgetBurnFast never appeared");
    assert!(state == "pending" || state == "firing", "{state}");
    // The TTFT SLO is met (2 ms): no alert for it.
    let alerts = server.api("/api/v1/alerts").await;
    assert!(!alerts.to_string().contains("\"slo\":\"ttft-500ms\""), "{alerts}");
    sidecar.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs promtool (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn promtool_check_metrics_passes_on_the_page_curl_gets() {
    let Some(promtool) = required_tool("promtool", &[], "apt-get install prometheus") else {
        return;
    };
    // Every family llmslo writes, the engine's merged in: requests that succeed and fail.
    let (engine, _stop) = start_engine(llmslo::tools::simulate::SimOptions {
        error_rate: 0.3,
        ..timed_engine(2, 1)
    })
    .await;
    let sidecar = start_sidecar(
        engine,
        "engine: vllm\nengine_metrics_interval: 1s\n\
         slos:\n  - name: ttft\n    objective: 99\n    ttft: 500ms\n",
    )
    .await;
    for _ in 0..10 {
        post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(4, true, true)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let page = http_get_text(sidecar.metrics_addr, "/metrics", "*/*").await;
    assert!(
        page.contains("llmslo_requests_total") && page.contains("llmslo_engine_"),
        "{page}"
    );
    let (passed, problems) = promtool_check_metrics(&promtool, &page);
    assert!(passed, "promtool check metrics: {problems}");

    // Merged, the engine's own families keep their names, and vLLM's `vllm:` prefix is the
    // one thing promtool objects to (as it does on vLLM's own page).
    let merged = start_sidecar(
        engine,
        "engine: vllm\nengine_metrics: merge\nengine_metrics_interval: 1s\n",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let page = http_get_text(merged.metrics_addr, "/metrics", "*/*").await;
    assert!(page.contains("vllm:"), "{page}");
    let (_, problems) = promtool_check_metrics(&promtool, &page);
    let problems: Vec<&str> = problems.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!problems.is_empty());
    for problem in problems {
        assert!(
            problem.starts_with("vllm:") && problem.ends_with("metric names should not contain ':'"),
            "{problem}"
        );
    }
}

/// Whether `promtool check metrics` passes `page`, and what it said.
fn promtool_check_metrics(promtool: &std::path::Path, page: &str) -> (bool, String) {
    use std::io::Write;
    let mut check = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let output = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

/// `path` as text, asking for `accept`.
async fn http_get_text(addr: std::net::SocketAddr, path: &str, accept: &str) -> String {
    use http_body_util::BodyExt;
    let request = http::Request::get(format!("http://{addr}{path}"))
        .header(http::header::ACCEPT, accept)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = client().request(request).await.unwrap();
    String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}
