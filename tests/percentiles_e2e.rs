//! Percentiles an SRE can quote, end to end with two real Prometheus servers (Debian's 2.42):
//! one scrapes the sidecar with native histograms enabled (protobuf exposition), the other
//! as a text-only scraper (classic buckets). A scripted engine sends each request at the TTFT
//! and TPOT drawn for it, on absolute deadlines; `histogram_quantile` over each server's
//! histograms is compared with the exact quantile of what the engine sent.

use crate::common::*;
use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use rand::{rngs::StdRng, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Output tokens per streamed answer.
const TOKENS: u32 = 21;
/// Requests per distribution.
const REQUESTS: usize = 300;
/// Streams in flight at once.
const CONCURRENCY: usize = 100;

/// One request's scripted timing, seconds.
#[derive(Clone, Copy, Debug)]
struct Timing {
    ttft: f64,
    tpot: f64,
}

/// The distributions, each served under its own model name.
fn plans() -> HashMap<&'static str, Vec<Timing>> {
    let mut rng = StdRng::seed_from_u64(26);
    // Median 30 ms, p99 about 80 ms: sigma = ln(80 / 30) / 2.326.
    let lognormal = LogNormal::new(0.030_f64.ln(), (80.0_f64 / 30.0).ln() / 2.326).unwrap();
    let fast = LogNormal::new(0.150_f64.ln(), 0.1).unwrap();
    let slow = LogNormal::new(0.900_f64.ln(), 0.1).unwrap();
    let constant = (0..REQUESTS)
        .map(|_| Timing {
            ttft: 0.02,
            tpot: 0.030,
        })
        .collect();
    let lognormal = (0..REQUESTS)
        .map(|_| Timing {
            ttft: 0.02,
            tpot: lognormal.sample(&mut rng),
        })
        .collect();
    // Seven in ten prompts hit the prefix cache (about 150 ms), three in ten do not (900 ms).
    let bimodal = (0..REQUESTS)
        .map(|i| Timing {
            ttft: if i % 10 < 7 {
                fast.sample(&mut rng)
            } else {
                slow.sample(&mut rng)
            },
            tpot: 0.005,
        })
        .collect();
    HashMap::from([("constant", constant), ("lognormal", lognormal), ("bimodal", bimodal)])
}

/// Per model: the timings still to serve, and those the engine actually sent.
#[derive(Clone, Default)]
struct Engine {
    planned: Arc<Mutex<HashMap<String, Vec<Timing>>>>,
    sent: Arc<Mutex<HashMap<String, Vec<Timing>>>>,
}

/// The engine: each chat request takes the next timing planned for its model, then streams
/// its tokens at `ttft + k * tpot` after arrival (absolute deadlines: no drift), noting when
/// it actually handed each token over.
async fn scripted_engine(plans: HashMap<&'static str, Vec<Timing>>) -> (std::net::SocketAddr, Engine) {
    let engine = Engine::default();
    *engine.planned.lock().unwrap() = plans
        .into_iter()
        .map(|(model, plan)| (model.to_string(), plan))
        .collect();
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/health", get(|| async { "" }))
        .with_state(engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, engine)
}

async fn chat(State(engine): State<Engine>, body: String) -> axum::response::Response {
    let arrived = Instant::now();
    let request: serde_json::Value = serde_json::from_str(&body).unwrap();
    let model = request["model"].as_str().unwrap().to_string();
    let timing = engine.planned.lock().unwrap().get_mut(&model).unwrap().pop().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(4);
    tokio::spawn(async move {
        let chunk = |delta: &str| {
            format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{delta}}}]}}\n\n")
        };
        let _ = tx.send(Ok(chunk("{\"role\":\"assistant\",\"content\":\"\"}"))).await;
        let (mut first, mut last) = (arrived, arrived);
        for k in 0..TOKENS {
            let due = arrived + Duration::from_secs_f64(timing.ttft + f64::from(k) * timing.tpot);
            tokio::time::sleep_until(due).await;
            let _ = tx.send(Ok(chunk("{\"content\":\" tok\"}"))).await;
            last = Instant::now();
            if k == 0 {
                first = last;
            }
        }
        let sent = Timing {
            ttft: (first - arrived).as_secs_f64(),
            tpot: (last - first).as_secs_f64() / f64::from(TOKENS - 1),
        };
        engine.sent.lock().unwrap().entry(model.clone()).or_default().push(sent);
        let usage = format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"{model}\",\"choices\":[],\
             \"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":{TOKENS},\"total_tokens\":{}}}}}\n\ndata: [DONE]\n\n",
            TOKENS + 5
        );
        let _ = tx.send(Ok(usage)).await;
    });
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
        .unwrap()
}

/// The nearest-rank `q` quantile of `values`.
fn exact(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The value of a one-element instant query, when there is one.
async fn scalar(server: &prometheus::Prometheus, expr: &str) -> Option<f64> {
    let result = server.query(expr).await;
    result.first()?["value"][1].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus (apt-get install prometheus); run with cargo test -- --include-ignored"]
async fn native_histograms_are_within_5_percent_and_classic_buckets_within_25() {
    let Some(binary) = prometheus::binary() else {
        return; // only outside CI, which installs it (.ci/run)
    };
    let (engine, sent) = scripted_engine(plans()).await;
    let sidecar = start_sidecar(
        engine,
        "engine: vllm\nmodels: [constant, lognormal, bimodal]\nhealth_interval: 1s\n",
    )
    .await;

    let dir = std::env::temp_dir().join(format!("llmslo-percentiles-{}", std::process::id()));
    let native = prometheus::start_with_flags(
        &binary,
        &dir.join("native"),
        sidecar.metrics_addr,
        "",
        "",
        &["--enable-feature=native-histograms"],
    );
    let classic = prometheus::start(&binary, &dir.join("classic"), sidecar.metrics_addr, "", "");

    let limit = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut requests = tokio::task::JoinSet::new();
    for model in ["constant", "lognormal", "bimodal"] {
        for _ in 0..REQUESTS {
            // Arrivals 2 ms apart, as from many users: a burst of first tokens all at once
            // would delay them on this small machine and skew the measured TPOT.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let permit = limit.clone().acquire_owned().await.unwrap();
            let body = format!(
                "{{\"model\":\"{model}\",\"stream\":true,\"stream_options\":{{\"include_usage\":true}},\
                 \"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}"
            );
            let proxy = sidecar.proxy_addr;
            requests.spawn(async move {
                let (status, _) = post_collect(proxy, "/v1/chat/completions", body).await;
                drop(permit);
                status
            });
        }
    }
    while let Some(status) = requests.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }

    // Both servers have scraped everything once each model's histograms hold every request.
    let everything_scraped = |model: &str| {
        (
            format!("histogram_count(sum(gen_ai_server_time_to_first_token_seconds{{model=\"{model}\"}}))"),
            format!("sum(gen_ai_server_time_to_first_token_seconds_count{{model=\"{model}\"}})"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut done = true;
        for model in ["constant", "lognormal", "bimodal"] {
            let (native_count, classic_count) = everything_scraped(model);
            done &= scalar(&native, &native_count).await == Some(REQUESTS as f64);
            done &= scalar(&classic, &classic_count).await == Some(REQUESTS as f64);
        }
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped all {REQUESTS} requests per model: native {:?}, classic {:?}",
            native
                .query("histogram_count(sum by (model) (gen_ai_server_time_to_first_token_seconds))")
                .await,
            classic
                .query("sum by (model) (gen_ai_server_time_to_first_token_seconds_count)")
                .await,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let cases = [
        ("constant", "gen_ai_server_time_per_output_token_seconds", "TPOT"),
        ("lognormal", "gen_ai_server_time_per_output_token_seconds", "TPOT"),
        ("bimodal", "gen_ai_server_time_to_first_token_seconds", "TTFT"),
    ];
    let sent = sent.sent.lock().unwrap().clone();
    let mut failures = Vec::new();
    eprintln!("distribution    q     exact ms  native ms (error)  classic ms (error)");
    for (model, family, what) in cases {
        let sent: Vec<f64> = sent[model]
            .iter()
            .map(|t| if what == "TPOT" { t.tpot } else { t.ttft })
            .collect();
        for q in [0.5, 0.9, 0.99] {
            let truth = exact(&sent, q);
            let from_native = scalar(
                &native,
                &format!("histogram_quantile({q}, sum({family}{{model=\"{model}\"}}))"),
            )
            .await
            .unwrap();
            let from_classic = scalar(
                &classic,
                &format!("histogram_quantile({q}, sum by (le) ({family}_bucket{{model=\"{model}\"}}))"),
            )
            .await
            .unwrap();
            let (native_error, classic_error) = (from_native / truth - 1.0, from_classic / truth - 1.0);
            eprintln!(
                "{model:9} {what} p{:<4} {:8.2}  {:8.2} ({:+5.1} %)  {:8.2} ({:+5.1} %)",
                q * 100.0,
                truth * 1e3,
                from_native * 1e3,
                native_error * 100.0,
                from_classic * 1e3,
                classic_error * 100.0
            );
            if native_error.abs() > 0.05 || classic_error.abs() > 0.25 {
                failures.push(format!("{model} {what} p{}", q * 100.0));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "outside 5 % (native) or 25 % (classic): {failures:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
