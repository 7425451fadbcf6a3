//! Every query in the Grafana dashboards, run against a real Prometheus that scrapes a live
//! sidecar under traffic (and evaluates the rules `llmslo rules` generates): each must parse,
//! name only metrics llmslo exports or rules it records, and return data, with the dashboard
//! variables substituted the way Grafana would.

use crate::common;

use crate::common::*;
use llmslo::slo::rules::{self, RulesFormat};
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// One query of one panel.
struct PanelQuery {
    at: String,
    expr: String,
}

/// The dashboard of disaggregated serving: its panels need a prefill/decode pair's traffic.
const DISAGGREGATED: &str = "disaggregated.json";

/// Every panel query and every variable query of the dashboards in dashboards/ that `wanted`
/// names.
fn dashboard_queries(wanted: impl Fn(&str) -> bool) -> (Vec<PanelQuery>, Vec<PanelQuery>) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let (mut panels, mut variables) = (Vec::new(), Vec::new());
    for file in files.iter().filter(|f| f.extension().is_some_and(|e| e == "json")) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if !wanted(&name) {
            continue;
        }
        let dashboard: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        // Grafana 10.0's schema: 10, 11 and 12 all load it (newer ones migrate it forward);
        // a newer one is refused by older Grafana.
        assert_eq!(
            dashboard["schemaVersion"].as_u64(),
            Some(38),
            "{name}: keep schemaVersion 38 for Grafana 10 and 11"
        );
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                panels.push(PanelQuery {
                    at: format!("{name} / {} / {}", panel["title"], target["refId"]),
                    expr: target["expr"].as_str().unwrap().to_string(),
                });
            }
        }
        let names: BTreeSet<_> = dashboard["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect();
        for wanted in ["datasource", "namespace", "pod", "model"] {
            assert!(names.contains(wanted), "{name}: no `{wanted}` variable");
        }
        for variable in dashboard["templating"]["list"].as_array().unwrap() {
            if variable["type"] == "query" {
                variables.push(PanelQuery {
                    at: format!("{name} / variable {}", variable["name"]),
                    expr: variable["query"]["query"].as_str().unwrap().to_string(),
                });
            }
        }
    }
    (panels, variables)
}

#[test]
fn latency_panels_show_exemplars() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/serving-overview.json");
    let dashboard: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut latency_targets = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let latency = [
                "gen_ai_server_time_to_first_token_seconds_bucket",
                "gen_ai_server_time_per_output_token_seconds_bucket",
                "gen_ai_server_request_duration_seconds_bucket",
            ]
            .iter()
            .any(|family| expr.contains(family));
            if latency && panel["type"] == "timeseries" {
                latency_targets += 1;
                assert_eq!(target["exemplar"], true, "{} / {}", panel["title"], target["refId"]);
            }
        }
    }
    assert!(latency_targets >= 9, "{latency_targets}");
}

/// The expression with Grafana's variables replaced: one concrete value each, or "All" (`.*`).
fn substitute(expr: &str, all: bool) -> String {
    let value = |concrete: &'static str| if all { ".*" } else { concrete };
    expr.replace("$__rate_interval", "1m")
        .replace("$namespace", value("llm"))
        .replace("$pod", value("vllm-0"))
        .replace("$model", value("sim"))
        .replace("$service", value("chat"))
}

/// `label_values(selector, label)` as a PromQL query whose result carries the label.
fn variable_as_promql(query: &str) -> (String, String) {
    let inner = query
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("variable query `{query}` is not label_values(selector, label)"));
    let (selector, label) = inner.rsplit_once(',').unwrap();
    (
        format!("count by ({0}) ({1})", label.trim(), selector.trim()),
        label.trim().to_string(),
    )
}

/// The metric names a query selects (every selector in llmslo's dashboards has braces).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    for (i, _) in expr.match_indices('{') {
        let start = bytes[..i]
            .iter()
            .rposition(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b':'))
            .map_or(0, |p| p + 1);
        if start < i && !expr[..start].ends_with('$') && !expr[..start].ends_with("{{") {
            names.push(expr[start..i].to_string());
        }
    }
    names
}

/// Prometheus 3 stores classic `le` and `quantile` values as floats and renamed `holt_winters`:
/// no query may select either label's value or call it. Every classic bucket query has its
/// native twin, for a Prometheus that stores native histograms only.
#[test]
fn queries_are_ready_for_prometheus_3() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for file in [
        "dashboards/serving-overview.json",
        "dashboards/gpu.json",
        "dashboards/slos.json",
        "dashboards/disaggregated.json",
        "examples/llmslo.rules.yaml",
        "deploy/prometheusrule.yaml",
        "deploy/keda-scaledobject.yaml",
        "deploy/hpa.yaml",
        "helm/llmslo/files/rules.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for banned in ["le=", "le!=", "le=~", "le!~", "quantile=", "quantile!=", "holt_winters"] {
            let selects = text
                .match_indices(banned)
                .any(|(at, _)| !text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'));
            assert!(!selects, "{file}: `{banned}` breaks on Prometheus 3");
        }
        for (at, _) in text.match_indices("_bucket") {
            let start = text[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |p| p + 1);
            let family = &text[start..at];
            let native_twin = ['{', '['].iter().any(|c| text.contains(&format!("({family}{c}")));
            assert!(native_twin, "{file}: `{family}_bucket` has no native form beside it");
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} classic bucket queries checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn every_dashboard_query_returns_data_from_a_live_sidecar() {
    let (panels, variables) = dashboard_queries(|name| name != DISAGGREGATED);
    assert!(panels.len() >= 40, "only {} panel queries", panels.len());
    let Some(binary) = prometheus::binary() else {
        return; // only outside CI, which installs it (.ci/run)
    };
    let (sidecar, config, _engine) = prometheus::failing_engine_and_sidecar(
        2,
        "  - {name: tpot-50ms, objective: 99, tpot: 50ms}\n  - {name: ttft-1ms, objective: 99, ttft: 1ms}\n\
         goodput: {require: [ttft-500ms, tpot-50ms]}\ngpu: {simulated: true, interval: 200ms}\n\
         tenants: {from: [{header: x-team}]}\n\
         cost: {gpu_hour_price: 4, slos: [{name: out, cost_per_million_output_tokens: 2.5}]}\n",
    )
    .await;
    let rule_file = rules::render(&config.slos, RulesFormat::Prometheus, rules::Scope::All);

    // The GPU families exist once a sample (taken on a blocking thread) is published.
    let sampled = |text: &str| text.contains("llmslo_gpu_energy_joules_total{");
    for _ in 0..200 {
        if sampled(&sidecar.metrics.encode()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = sidecar.metrics.encode();
    let gpu: Vec<&str> = text.lines().filter(|l| l.contains("gpu")).collect();
    assert!(sampled(&text), "no GPU sample within 10 s: {gpu:?}");
    // Every metric a query names is one the sidecar exports (some only once a request has
    // shown them: the engine's phases, the causes of bad events) or a rule records.
    // (The engine fails 30 % of requests: send until a success has shown both.)
    for _ in 0..100 {
        post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(6, true, true)).await;
        let text = settled(&sidecar).await;
        if text.contains("llmslo_slo_bad_events_by_cause_total{")
            && text.contains("llmslo_engine_queue_time_seconds_count{")
        {
            break;
        }
    }
    let exported = settled(&sidecar).await;
    names_are_exported_or_recorded(&[exported], &rule_file, panels.iter().chain(&variables));

    // One Prometheus scrapes the text exposition (classic buckets), one the protobuf with
    // native histograms: every query must return data from both.
    let dir = std::env::temp_dir().join(format!("llmslo-dashboards-{}", std::process::id()));
    let labels = "namespace: llm, pod: vllm-0";
    let classic = prometheus::start(&binary, &dir.join("classic"), sidecar.metrics_addr, &rule_file, labels);
    let native = prometheus::start_with_flags(
        &binary,
        &dir.join("native"),
        sidecar.metrics_addr,
        &rule_file,
        labels,
        &["--enable-feature=native-histograms"],
    );
    let servers = [("classic", &classic), ("native", &native)];
    let load = prometheus::Load::start(sidecar.proxy_addr, chat_body(6, true, true));

    every_query_returns_data(&servers, &panels, &variables).await;
    load.stop().await;
    // The native server answered from native histograms alone: it stored no classic buckets.
    assert!(native
        .query("gen_ai_server_time_per_output_token_seconds_bucket")
        .await
        .is_empty());
    assert!(!native
        .query("histogram_count(gen_ai_server_time_per_output_token_seconds)")
        .await
        .is_empty());
    eprintln!(
        "{} panel queries (each with one value and with All) and {} variable queries returned data \
         from a classic and a native Prometheus",
        panels.len(),
        variables.len()
    );
    sidecar.shutdown().await;
    drop((classic, native));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Runs every panel query (with one value and with All for the variables) and every variable
/// query on each of `servers` until it returns data: a parse error fails at once, a query still
/// empty after 120 s fails the test.
async fn every_query_returns_data(
    servers: &[(&str, &prometheus::Prometheus)],
    panels: &[PanelQuery],
    variables: &[PanelQuery],
) {
    // Queries leave the list once they return data; a parse error fails at once.
    let mut waiting: Vec<(usize, &PanelQuery, bool)> = (0..servers.len())
        .flat_map(|s| panels.iter().flat_map(move |q| [(s, q, false), (s, q, true)]))
        .collect();
    let mut variables_waiting: Vec<(usize, &PanelQuery)> = (0..servers.len())
        .flat_map(|s| variables.iter().map(move |q| (s, q)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && !(waiting.is_empty() && variables_waiting.is_empty()) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut still = Vec::new();
        for (server, query, all) in waiting {
            let answer = servers[server].1.query_answer(&substitute(&query.expr, all)).await;
            if answer.is_null() {
                still.push((server, query, all));
                continue;
            }
            assert_eq!(
                answer["status"], "success",
                "{}: {}\n{}",
                query.at, answer["error"], query.expr
            );
            if answer["data"]["result"].as_array().is_none_or(|r| r.is_empty()) {
                still.push((server, query, all));
            }
        }
        waiting = still;
        let mut still = Vec::new();
        for (server, query) in variables_waiting {
            let (promql, label) = variable_as_promql(&substitute(&query.expr, false));
            let result = servers[server].1.query(&promql).await;
            if !result
                .iter()
                .any(|r| r["metric"][&label].as_str().is_some_and(|v| !v.is_empty()))
            {
                still.push((server, query));
            }
        }
        variables_waiting = still;
    }
    let empty: Vec<String> = waiting
        .iter()
        .map(|(s, q, all)| {
            let value = if *all { "All" } else { "one value" };
            format!("{} ({}, {value}): {}", q.at, servers[*s].0, q.expr)
        })
        .chain(
            variables_waiting
                .iter()
                .map(|(s, q)| format!("{} ({}): {}", q.at, servers[*s].0, q.expr)),
        )
        .collect();
    assert!(
        empty.is_empty(),
        "queries still empty after 120 s:\n{}",
        empty.join("\n")
    );
}

/// Every metric a query names is one of the `pages` exports (as a family, or its `_total`,
/// `_bucket`, `_count`, `_sum`) or a rule of `rule_file` records.
fn names_are_exported_or_recorded<'a>(
    pages: &[String],
    rule_file: &str,
    queries: impl Iterator<Item = &'a PanelQuery>,
) {
    let mut known: BTreeSet<String> = ["ALERTS".to_string()].into();
    for exported in pages {
        for line in exported.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let family = line.split(' ').next().unwrap();
            for suffix in ["", "_total", "_bucket", "_count", "_sum"] {
                known.insert(format!("{family}{suffix}"));
            }
        }
    }
    for line in rule_file.lines().filter_map(|l| l.trim().strip_prefix("- record: ")) {
        known.insert(line.trim().to_string());
    }
    for query in queries {
        for name in metric_names(&query.expr) {
            assert!(
                known.contains(&name),
                "{}: `{name}` is neither exported nor recorded",
                query.at
            );
        }
    }
}

/// A simulated engine of a disaggregated pair, stating each request's own timing.
fn pd_engine() -> llmslo::tools::simulate::SimOptions {
    llmslo::tools::simulate::SimOptions {
        ttft: llmslo::tools::simulate::delay::Delay::Fixed(Duration::from_millis(20)),
        tpot: llmslo::tools::simulate::delay::Delay::Fixed(Duration::from_millis(2)),
        per_request_metrics: true,
        pd: Some(llmslo::tools::simulate::disagg::PdOptions {
            prefill_per_token: Duration::from_micros(20),
            transfer_per_token: Duration::from_micros(10),
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn the_disaggregated_dashboard_returns_data_from_a_live_prefill_decode_pair() {
    let (panels, variables) = dashboard_queries(|name| name == DISAGGREGATED);
    assert!(panels.len() >= 8, "only {} panel queries", panels.len());
    let Some(binary) = prometheus::binary() else {
        return;
    };
    // Prefill pod: llmslo in front of the engine. Decode pod: llmslo in front of the routing
    // sidecar (relaying the prefill legs) and, misplaced, one behind it.
    let (prefill_engine, _p) = start_engine(pd_engine()).await;
    let (decode_engine, _d) = start_engine(pd_engine()).await;
    let prefill = start_sidecar(prefill_engine, "role: prefill\n").await;
    let behind = start_sidecar(decode_engine, "").await;
    let router = common::routing::start_routing_sidecar(behind.proxy_addr).await;
    let slos =
        "slos:\n  - {name: ttft-1ms, objective: 99, ttft: 1ms}\n  - {name: tpot-1ms, objective: 99, tpot: 1ms}\n";
    let front = start_sidecar(
        router,
        &format!(
            "role: decode\nprefill_relay: 127.0.0.1:{}\nprefill_pool: [{}]\n{slos}",
            free_port(),
            prefill.proxy_addr
        ),
    )
    .await;
    let config = llmslo::config::Config::from_yaml(&format!("upstream: http://{router}\n{slos}")).unwrap();
    let rule_file = rules::render(&config.slos, RulesFormat::Prometheus, rules::Scope::All);

    // Disaggregated requests from a client, until stopped.
    let stop = tokio_util::sync::CancellationToken::new();
    let load = {
        let (stop, front, prefill) = (stop.clone(), front.proxy_addr, prefill.proxy_addr);
        tokio::spawn(async move {
            let http = client();
            while !stop.is_cancelled() {
                let request = http::Request::post(format!("http://{front}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .header("x-prefiller-host-port", prefill.to_string())
                    .body(http_body_util::Full::from(chat_body(4, true, false)))
                    .unwrap();
                let response = http.request(request).await.unwrap();
                assert_eq!(response.status(), 200);
                http_body_util::BodyExt::collect(response.into_body()).await.unwrap();
            }
        })
    };
    let pages = loop {
        let pages = [
            front.metrics.encode(),
            prefill.metrics.encode(),
            behind.metrics.encode(),
        ];
        let shown = |page: &String, family: &str| page.contains(&format!("{family}{{"));
        if shown(&pages[0], "llmslo_ttft_part_seconds_count")
            && shown(&pages[0], "llmslo_slo_bad_events_by_cause_total")
            && shown(&pages[1], "llmslo_legs_total")
            && shown(&pages[2], "llmslo_placement_warning")
        {
            break pages;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    names_are_exported_or_recorded(&pages, &rule_file, panels.iter().chain(&variables));

    // Every pod answers to the one value the test gives `$pod`; each is its own instance.
    let dir = std::env::temp_dir().join(format!("llmslo-pd-dashboard-{}", std::process::id()));
    let labels = "namespace: llm, pod: vllm-0";
    let targets = [
        (front.metrics_addr, labels),
        (prefill.metrics_addr, labels),
        (behind.metrics_addr, labels),
    ];
    let classic = prometheus::start_scraping(&binary, &dir.join("classic"), &targets, &rule_file, &[]);
    let native = prometheus::start_scraping(
        &binary,
        &dir.join("native"),
        &targets,
        &rule_file,
        &["--enable-feature=native-histograms"],
    );
    every_query_returns_data(&[("classic", &classic), ("native", &native)], &panels, &variables).await;
    // The pools by role: the prefill pod's and the decode pod's load are apart.
    let pools = classic.query("llmslo:pool_load_requests_per_second:sum").await;
    let roles: BTreeSet<&str> = pools.iter().filter_map(|p| p["metric"]["role"].as_str()).collect();
    assert!(roles.contains("prefill") && roles.contains("decode"), "{pools:?}");
    stop.cancel();
    load.await.unwrap();
    for sidecar in [front, prefill, behind] {
        sidecar.shutdown().await;
    }
    drop((classic, native));
    std::fs::remove_dir_all(dir).unwrap();
}
