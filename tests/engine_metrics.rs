//! The engine's own `/metrics`, read by the sidecar from a real mock engine on 127.0.0.1: its
//! signals mapped to engine-neutral gauges for vLLM's, SGLang's and TGI's formats, the whole
//! page merged into llmslo's exposition on request, and every way the page can go wrong
//! (slow, huge, garbage) bounded without delaying llmslo's own `/metrics` or the traffic.

use crate::common::prometheus;
use crate::common::*;
use llmslo::sidecar::Sidecar;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// An engine that answers `GET /metrics` with `page` and every other request with the real
/// vLLM chat capture.
async fn engine_with_page(page: Script) -> std::net::SocketAddr {
    let chat = paced_capture(Duration::from_millis(5), Duration::from_millis(1));
    scripted_upstream_by(move |request| {
        if request.starts_with(b"GET /metrics") {
            page.clone()
        } else {
            chat.clone()
        }
    })
    .await
    .0
}

fn text_page(body: &str) -> Script {
    Script {
        head: "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\ntransfer-encoding: chunked"
            .to_string(),
        ..Script::sse(vec![(Duration::ZERO, body.as_bytes().to_vec())])
    }
}

/// Waits until `llmslo_engine_scrape_up` reads `up`; returns the exposition then.
async fn scrape_up(sidecar: &Sidecar, up: f64) -> String {
    for _ in 0..100 {
        let text = sidecar.metrics.encode();
        if text.contains("llmslo_engine_scrape_up") && sample(&text, "llmslo_engine_scrape_up", &[]) == up {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("llmslo_engine_scrape_up never read {up}:\n{}", sidecar.metrics.encode());
}

/// The real vLLM 0.32 page with a busy engine's values.
fn busy_vllm_page() -> String {
    String::from_utf8(fixture("vllm-0.32-metrics.txt"))
        .unwrap()
        .replace(
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 0.0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 7.0",
        )
        .replace(
            "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 0.0",
            "vllm:num_requests_running{engine=\"0\",model_name=\"tiny\"} 12.0",
        )
        .replace(
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.0",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny\"} 0.42",
        )
        .replace(
            "vllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"} 0.0",
            "vllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"} 3.0",
        )
        .replace(
            "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny\"} 0.0",
            "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"tiny\"} 4.0",
        )
}

const SGLANG: &str = "# HELP sglang:num_queue_reqs The number of requests in the waiting queue\n\
# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 5\n\
# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 30\n\
# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.8\n\
# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate{model_name=\"m\"} 0.25\n";

const TGI: &str =
    "# TYPE tgi_queue_size gauge\ntgi_queue_size 2\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 9\n";

#[tokio::test]
async fn each_engines_page_maps_to_the_same_gauges_exactly() {
    // (page, waiting, running, [KV cache usage, preemptions, prefix-cache hit ratio])
    let cases: [(String, f64, f64, [Option<f64>; 3]); 3] = [
        (busy_vllm_page(), 7.0, 12.0, [Some(0.42), Some(3.0), Some(4.0 / 17.0)]),
        (SGLANG.to_string(), 5.0, 30.0, [Some(0.8), None, Some(0.25)]),
        (TGI.to_string(), 2.0, 9.0, [None, None, None]),
    ];
    for (page, waiting, running, [kv, preemptions, hit_ratio]) in cases {
        let engine = engine_with_page(text_page(&page)).await;
        let sidecar = start_sidecar(engine, "engine_metrics_interval: 1s\n").await;
        let text = scrape_up(&sidecar, 1.0).await;
        assert_eq!(sample(&text, "llmslo_engine_requests_waiting", &[]), waiting);
        assert_eq!(sample(&text, "llmslo_engine_requests_running", &[]), running);
        let optional = |name: &str| text.contains(&format!("\n{name} ")).then(|| sample(&text, name, &[]));
        assert_eq!(optional("llmslo_engine_kv_cache_usage_ratio"), kv);
        assert_eq!(optional("llmslo_engine_preemptions_total"), preemptions);
        assert_eq!(optional("llmslo_engine_prefix_cache_hit_ratio"), hit_ratio);
        assert!(
            !text.contains("vllm:") && !text.contains("sglang:") && !text.contains("tgi_"),
            "map mode re-exports nothing of the engine's own"
        );
        assert!(sample(&text, "llmslo_engine_scrape_duration_seconds", &[]) < 2.0);
        // A request meets the queue the page showed as it arrived.
        let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
        assert_eq!(status, 200);
        let text = settled(&sidecar).await;
        let chat = [("operation", "chat")];
        assert_eq!(
            sample(&text, "llmslo_engine_requests_waiting_at_arrival_count", &chat),
            1.0
        );
        assert_eq!(
            sample(&text, "llmslo_engine_requests_waiting_at_arrival_sum", &chat),
            waiting
        );
        sidecar.shutdown().await;
    }
}

/// The `# TYPE` names of an exposition.
fn family_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect()
}

#[tokio::test]
async fn merge_adds_the_engines_families_once_and_leaves_llmslos_own_alone() {
    let page = busy_vllm_page();
    let engine = engine_with_page(text_page(&page)).await;
    let merged = start_sidecar(engine, "engine_metrics: merge\nengine_metrics_interval: 1s\n").await;
    let mapped = start_sidecar(engine, "engine_metrics: map\nengine_metrics_interval: 1s\n").await;
    let text = scrape_up(&merged, 1.0).await;
    let own = scrape_up(&mapped, 1.0).await;

    assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1);
    let names = family_names(&text);
    let unique: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(names.len(), unique.len(), "no family twice");
    // OpenMetrics names a counter without `_total`; its samples keep it.
    assert!(text.contains("# TYPE vllm:num_preemptions counter\n"));
    assert!(text.contains("\nvllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"} 3.0\n"));
    assert!(text.contains("\nvllm:num_requests_waiting{engine=\"0\",model_name=\"tiny\"} 7.0\n"));
    assert!(text.contains("# TYPE vllm:time_to_first_token_seconds histogram\n"));
    assert!(
        !text.contains("vllm:num_preemptions_created"),
        "the Python client's *_created gauges are left out"
    );
    // llmslo's own families come first, exactly as without merge.
    let engine_start = text
        .find("# HELP python_gc")
        .or_else(|| text.find("# HELP vllm:"))
        .unwrap();
    let own_families = family_names(&own);
    assert_eq!(family_names(&text[..engine_start]), own_families);
    // Every engine family but the Python client's artefacts is there.
    let engine_families: HashSet<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter(|l| !l.contains("_created "))
        .map(|l| match l.split_once(' ').unwrap() {
            (name, "counter") => name.trim_end_matches("_total"),
            (name, _) => name,
        })
        .collect();
    for name in &engine_families {
        assert!(unique.contains(name), "{name} is merged");
    }
    merged.shutdown().await;
    mapped.shutdown().await;
}

#[tokio::test]
async fn a_slow_engine_page_never_delays_llmslos_metrics_or_the_traffic() {
    let silent = Script {
        silent: true,
        ..text_page("")
    };
    let engine = engine_with_page(silent).await;
    let sidecar = start_sidecar(engine, "engine_metrics_interval: 1s\n").await;
    let started = Instant::now();
    let (status, _) = get(sidecar.metrics_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let (status, body) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
    assert_eq!(status, 200);
    assert!(body.ends_with(b"data: [DONE]\n\n"), "the traffic flows");
    let text = scrape_up(&sidecar, 0.0).await;
    let took = sample(&text, "llmslo_engine_scrape_duration_seconds", &[]);
    assert!((2.0..2.5).contains(&took), "bounded by the 2 s timeout: {took}");
    assert!(!text.contains("llmslo_engine_requests_waiting"));
    sidecar.shutdown().await;
}

#[tokio::test]
async fn a_huge_or_garbled_page_is_refused_and_nothing_else_breaks() {
    let huge = "# TYPE x gauge\n".to_string() + &"x 1\n".repeat(9 << 18);
    for page in [
        text_page(&huge),
        text_page("<html><body>not metrics</body></html>\n"),
        Script {
            head: "HTTP/1.1 404 Not Found\r\ncontent-length: 0".to_string(),
            ..text_page("")
        },
    ] {
        let engine = engine_with_page(page).await;
        let sidecar = start_sidecar(engine, "engine_metrics: merge\nengine_metrics_interval: 1s\n").await;
        let text = scrape_up(&sidecar, 0.0).await;
        assert!(!text.contains("# TYPE x ") && !text.contains("llmslo_engine_requests_waiting"));
        let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
        assert_eq!(status, 200);
        let text = settled(&sidecar).await;
        assert_eq!(
            sample(
                &text,
                "llmslo_requests_total",
                &[("outcome", "success"), ("operation", "chat")]
            ),
            1.0
        );
        sidecar.shutdown().await;
    }
}

#[tokio::test]
async fn engine_metrics_off_reads_nothing() {
    let (upstream, log) = scripted_upstream(text_page(TGI)).await;
    let sidecar = start_sidecar(upstream, "engine_metrics: off\n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = sidecar.metrics.encode();
    assert!(!text.contains("llmslo_engine_scrape_up"));
    assert!(!log.lock().unwrap().iter().any(|r| r.starts_with(b"GET /metrics")));
    sidecar.shutdown().await;
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, bytes::Bytes) {
    let response = client()
        .request(
            http::Request::get(format!("http://{addr}{path}"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn a_real_prometheus_ingests_the_merged_page_as_text_and_as_protobuf() {
    let Some(binary) = prometheus::binary() else {
        return; // only outside CI, which installs it (.ci/run)
    };
    // The real page with hostile lines: malformed ones, which a scraper rejects the whole
    // page for, and series under llmslo's own names.
    let hostile = "vllm:bad{model_name=tiny} 1\nvllm:bad{a=\"1\",a=\"2\"} 1\n9vllm:bad 1\nvllm:bad{a=\"1\",} 1\n\
                   # TYPE llmslo_slo_bad_events counter\nllmslo_slo_bad_events_total{slo=\"availability\",extra=\"x\"} 999\n";
    let engine = engine_with_page(text_page(&(busy_vllm_page() + hostile))).await;
    let sidecar = start_sidecar(engine, "engine_metrics: merge\nengine_metrics_interval: 1s\n").await;
    scrape_up(&sidecar, 1.0).await;
    let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(8, true, false)).await;
    assert_eq!(status, 200);
    let dir = std::env::temp_dir().join(format!("llmslo-merge-{}", std::process::id()));
    let rules = "groups: []\n";
    let text = prometheus::start(&binary, &dir.join("text"), sidecar.metrics_addr, rules, "pod: vllm-0");
    let protobuf = prometheus::start_with_flags(
        &binary,
        &dir.join("protobuf"),
        sidecar.metrics_addr,
        rules,
        "pod: vllm-0",
        &["--enable-feature=native-histograms"],
    );
    // (query, the value it must read) on both servers: the engine's own series, llmslo's
    // mapping of them, a classic engine histogram, and llmslo's own TTFT.
    let checks = [
        ("up", 1.0),
        ("vllm:num_requests_waiting", 7.0),
        ("vllm:num_preemptions_total", 3.0),
        ("llmslo_engine_requests_waiting", 7.0),
        ("count(llmslo_slo_bad_events_total{extra=\"x\"}) or vector(0)", 0.0),
        ("vllm:bad{a=\"1\"}", 1.0),
        ("sum(vllm:time_to_first_token_seconds_count)", 2.0),
        (
            "sum(gen_ai_server_time_to_first_token_seconds_count{operation=\"chat\"}) or sum(histogram_count(gen_ai_server_time_to_first_token_seconds{operation=\"chat\"}))",
            1.0,
        ),
    ];
    for (name, server) in [("text", &text), ("protobuf", &protobuf)] {
        let mut pending: Vec<(&str, f64)> = checks.to_vec();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !pending.is_empty() && Instant::now() < deadline {
            let mut still = Vec::new();
            for (query, want) in pending {
                let result = server.query(query).await;
                let got = result
                    .first()
                    .and_then(|r| r["value"][1].as_str())
                    .and_then(|v| v.parse::<f64>().ok());
                if got != Some(want) {
                    still.push((query, want));
                }
            }
            pending = still;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(pending.is_empty(), "{name}: never read {pending:?}");
    }
    drop((text, protobuf));
    std::fs::remove_dir_all(dir).unwrap();
    sidecar.shutdown().await;
}
