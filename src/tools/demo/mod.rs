//! `llmslo demo`: a continuous-batching simulated engine that reasons before it answers,
//! the sidecar in front of it, a streaming load over the chat, Responses and Messages APIs
//! that ramps up past the engine's knee and back, and a live view of what the sidecar
//! measures: exact latency percentiles from the sidecar's own per-request records (not from
//! bucket interpolation), and from its `/metrics` the counts and each SLO's attainment, burn
//! rate and budget.

mod exact;
mod feed;
mod table;

use crate::config::Config;
use crate::sidecar::{termination_signal, Sidecar};
use crate::tools::simulate::batching::BatchingOptions;
use crate::tools::simulate::{SimEngine, SimOptions};
use bytes::Bytes;
use exact::{gather_records, Exact};
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use table::{fit_width, render_apis, render_causes, render_slos, render_table, share_of, Previous, WIDTH};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Demo settings from the command line.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Sidecar proxy address.
    pub listen: SocketAddr,
    /// Sidecar metrics address.
    pub metrics_listen: SocketAddr,
    /// The simulated engine's address (port 0: any free one).
    pub engine_listen: SocketAddr,
    /// Streaming clients at the peak of the load.
    pub concurrency: usize,
    /// One ramp of the load up to `concurrency` and back; zero holds it there.
    pub ramp: Duration,
    /// Time between table prints.
    pub interval: Duration,
    /// Stop after this long; `None` runs until Ctrl-C.
    pub duration: Option<Duration>,
}

const MODELS: [&str; 2] = ["llama-sim-8b", "qwen-sim-1.5b"];

/// The APIs the demo's clients speak in turn: (route, `operation` label).
const APIS: [(&str, &str); 3] = [
    ("/v1/chat/completions", "chat"),
    ("/v1/responses", "responses"),
    ("/v1/messages", "messages"),
];

/// Output tokens the demo engine reasons for before each answer.
const REASONING_TOKENS: u32 = 6;

/// The demo engine's batching: TPOT is 15 ms + 1.5 ms per running sequence, so the 50 ms TPOT
/// SLO holds up to about 23 concurrent streams: the knee the ramp goes past.
const DEMO_BATCHING: BatchingOptions = BatchingOptions {
    step_base: Duration::from_millis(15),
    step_per_seq: Duration::from_micros(1500),
    prefill_per_token: Duration::from_micros(20),
    max_batch: 128,
    kv_tokens: None,
    step_jitter: 0.0,
};

type DemoClient = Client<HttpConnector, Full<Bytes>>;

/// The SLOs of the demo and the benchmark: TTFT, TPOT and availability, with goodput.
pub(crate) const EXAMPLE_SLOS: &str = "slos:
  - {name: ttft-500ms, objective: 99, ttft: 500ms}
  - {name: tpot-50ms, objective: 99, tpot: 50ms}
  - {name: availability, objective: 99.9, availability: true}
goodput: {require: [ttft-500ms, tpot-50ms]}
";

/// Runs the demo until Ctrl-C or the configured duration.
pub async fn run(options: DemoOptions) -> Result<(), Box<dyn std::error::Error>> {
    let shutdown = CancellationToken::new();
    let engine_listener = TcpListener::bind(options.engine_listen)
        .await
        .map_err(|e| format!("the demo's engine on {}: {e}", options.engine_listen))?;
    let engine_addr = engine_listener.local_addr()?;
    let engine = SimEngine::new(SimOptions {
        models: MODELS.iter().map(|m| m.to_string()).collect(),
        // Rare engine faults: the availability SLO stays healthy, the TPOT SLO tells the story.
        error_rate: 0.0005,
        midstream_error_rate: 0.0005,
        batching: Some(DEMO_BATCHING),
        reasoning_tokens: REASONING_TOKENS,
        // Each request's own timing, as vLLM states it with --enable-per-request-metrics.
        per_request_metrics: true,
        ..SimOptions::default()
    });
    let engine_task = tokio::spawn(engine.serve(engine_listener, shutdown.clone()));

    // The example SLOs and a simulated GPU, so every dashboard panel has data.
    let mut config = Config::from_yaml(&format!(
        "upstream: http://{engine_addr}\nengine: vllm\nhealth_interval: 1s\nservice: chat\n{EXAMPLE_SLOS}gpu: {{simulated: true}}\n"
    ))?;
    config.listen = options.listen;
    config.metrics_listen = options.metrics_listen;
    // The demo's own view is its only scraper, and it reads the last figures before stopping:
    // no final scrape to wait for.
    config.final_scrape_grace = Duration::ZERO;
    let period = config.slos.period;
    let capacity_needs = crate::capacity::model::requests_to_see_tail(&config.slos);
    let feed = Arc::new(feed::RecordFeed::default());
    let records = feed.subscribe();
    let sidecar = Sidecar::start_with(&config, vec![feed]).await?;
    let (view_exact, whole_exact) = (
        Arc::new(Mutex::new(Exact::default())),
        Arc::new(Mutex::new(Exact::default())),
    );
    tokio::spawn(gather_records(records, [view_exact.clone(), whole_exact.clone()]));
    println!(
        "llmslo demo: simulated engine on http://{engine_addr}, sidecar on http://{}",
        sidecar.proxy_addr
    );
    println!(
        "metrics: http://{}/metrics   (Ctrl-C stops everything)\n",
        sidecar.metrics_addr
    );

    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: DemoClient = Client::builder(TokioExecutor::new()).build(connector);
    let active = Arc::new(AtomicUsize::new(clients_at(
        Duration::ZERO,
        options.concurrency,
        options.ramp,
    )));
    let mut load = JoinSet::new();
    for worker in 0..options.concurrency {
        load.spawn(stream_forever(
            client.clone(),
            sidecar.proxy_addr,
            worker,
            active.clone(),
            shutdown.clone(),
        ));
    }

    let stop = async {
        match options.duration {
            Some(d) => {
                tokio::select! { _ = tokio::time::sleep(d) => {}, _ = termination_signal() => {} }
            }
            None => termination_signal().await,
        }
    };
    tokio::pin!(stop);
    let mut ticker = tokio::time::interval(options.interval);
    ticker.tick().await;
    let started = tokio::time::Instant::now();
    let mut previous = Previous {
        tokens: BTreeMap::new(),
        at: started,
    };
    // On a terminal the view is redrawn in place; otherwise each one is appended.
    let redraw = std::io::stdout().is_terminal();
    let mut ramp = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = ramp.tick() => {
                active.store(clients_at(started.elapsed(), options.concurrency, options.ramp), Ordering::Relaxed);
            }
            _ = ticker.tick() => {
                let text = scrape(&client, sidecar.metrics_addr).await?;
                let clients = active.load(Ordering::Relaxed);
                let exact = std::mem::take(&mut *view_exact.lock().expect("demo records lock"));
                let view = format!(
                    "{:.0?} in, {clients} of {} clients streaming\n\n{}{}{}{}",
                    started.elapsed(),
                    options.concurrency,
                    render_table(&text, &mut previous, &exact),
                    render_apis(&text, &exact),
                    render_slos(&text, share_of(started.elapsed(), period), capacity_needs),
                    render_causes(&text),
                );
                let view = fit_width(&view, WIDTH);
                if redraw {
                    print!("\x1b[2J\x1b[H{view}");
                } else {
                    print!("{view}");
                }
            }
        }
    }
    // The summary is read before anything stops: stopping cuts streams short, which the
    // sidecar rightly counts (cancelled, or engine errors as the engine goes), but the run
    // being summed up did not have them.
    let text = scrape(&client, sidecar.metrics_addr).await?;
    let exact = std::mem::take(&mut *whole_exact.lock().expect("demo records lock"));
    shutdown.cancel();
    while load.join_next().await.is_some() {}
    let mut whole_run = Previous {
        tokens: BTreeMap::new(),
        at: started,
    };
    println!("whole run ({:.0?}):", started.elapsed());
    print!("{}", fit_width(&render_table(&text, &mut whole_run, &exact), WIDTH));
    if crate::sidecar::stop_unless_interrupted_again(sidecar).await {
        let _ = engine_task.await;
    }
    Ok(())
}

/// Clients streaming `elapsed` into the run: a triangle from an eighth of `peak` up to `peak`
/// and back down over each `ramp`, or `peak` throughout when `ramp` is zero.
fn clients_at(elapsed: Duration, peak: usize, ramp: Duration) -> usize {
    if ramp.is_zero() {
        return peak;
    }
    let low = (peak / 8).max(1);
    let phase = (elapsed.as_secs_f64() / ramp.as_secs_f64()).fract();
    let height = 1.0 - (2.0 * phase - 1.0).abs(); // 0 → 1 → 0
    low + ((peak - low) as f64 * height).round() as usize
}

/// One client: streams requests back to back on its API (chat, Responses or Messages, by
/// worker) until `shutdown`, while the ramp has it among the active ones.
async fn stream_forever(
    client: DemoClient,
    proxy: SocketAddr,
    worker: usize,
    active: Arc<AtomicUsize>,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        if worker >= active.load(Ordering::Relaxed) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                _ = shutdown.cancelled() => return,
            }
        }
        let (model, max_tokens) = {
            let mut rng = rand::rng();
            (MODELS[worker % MODELS.len()], rng.random_range(16..=96))
        };
        let (route, operation) = APIS[worker % APIS.len()];
        let question = serde_json::json!([{"role": "user", "content": "Tell me about latency."}]);
        let body = match operation {
            "responses" => serde_json::json!({
                "model": model, "input": question, "max_output_tokens": max_tokens, "stream": true,
            }),
            _ => serde_json::json!({
                "model": model, "messages": question, "max_tokens": max_tokens, "stream": true,
            }),
        };
        let request = Request::post(format!("http://{proxy}{route}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let exchange = async {
            if let Ok(response) = client.request(request).await {
                let _ = response.into_body().collect().await;
            }
        };
        tokio::select! {
            _ = exchange => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn scrape(client: &DemoClient, metrics: SocketAddr) -> Result<String, Box<dyn std::error::Error>> {
    let request = Request::get(format!("http://{metrics}/metrics")).body(Full::new(Bytes::new()))?;
    let body = client.request(request).await?.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_ramps_up_to_the_peak_and_back() {
        let at = |secs: u64| clients_at(Duration::from_secs(secs), 40, Duration::from_secs(120));
        assert_eq!(at(0), 5, "an eighth of the peak");
        assert_eq!(at(60), 40, "the peak half-way");
        assert_eq!(at(30), 23);
        assert_eq!(at(120), 5, "and back");
        assert_eq!(clients_at(Duration::from_secs(7), 40, Duration::ZERO), 40, "no ramp");
    }
}
