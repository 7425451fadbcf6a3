//! `llmslo demo`: a simulated engine, the sidecar in front of it, a small streaming load,
//! and a live table of what the sidecar measures, read from its own `/metrics` the way
//! Prometheus's `histogram_quantile` would.

use crate::config::Config;
use crate::sidecar::{termination_signal, Sidecar};
use crate::simulate::{SimEngine, SimOptions};
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
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
    /// Concurrent streaming clients.
    pub concurrency: usize,
    /// Time between table prints.
    pub interval: Duration,
    /// Stop after this long; `None` runs until Ctrl-C.
    pub duration: Option<Duration>,
}

const MODELS: [&str; 2] = ["llama-sim-8b", "qwen-sim-1.5b"];

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
    let engine_listener = TcpListener::bind("127.0.0.1:0").await?;
    let engine_addr = engine_listener.local_addr()?;
    let engine = SimEngine::new(SimOptions {
        models: MODELS.iter().map(|m| m.to_string()).collect(),
        ttft: "uniform:60ms..300ms".parse()?,
        tpot: "normal:25ms,5ms".parse()?,
        error_rate: 0.01,
        midstream_error_rate: 0.01,
        ..SimOptions::default()
    });
    let engine_task = tokio::spawn(engine.serve(engine_listener, shutdown.clone()));

    // The example SLOs and a simulated GPU, so every dashboard panel has data.
    let mut config = Config::from_yaml(&format!(
        "upstream: http://{engine_addr}\nengine: vllm\nhealth_interval: 1s\nservice: chat\n{EXAMPLE_SLOS}gpu: {{simulated: true}}\n"
    ))?;
    config.listen = options.listen;
    config.metrics_listen = options.metrics_listen;
    let sidecar = Sidecar::start(&config).await?;
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
    let mut load = JoinSet::new();
    for worker in 0..options.concurrency {
        load.spawn(stream_forever(
            client.clone(),
            sidecar.proxy_addr,
            worker,
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
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = ticker.tick() => {
                let text = scrape(&client, sidecar.metrics_addr).await?;
                print!("{}", render_table(&text, &mut previous));
            }
        }
    }
    shutdown.cancel();
    while load.join_next().await.is_some() {}
    let text = scrape(&client, sidecar.metrics_addr).await?;
    let mut whole_run = Previous {
        tokens: BTreeMap::new(),
        at: started,
    };
    println!("whole run ({:.0?}):", started.elapsed());
    print!("{}", render_table(&text, &mut whole_run));
    sidecar.shutdown().await;
    let _ = engine_task.await;
    Ok(())
}

/// One client: streams chat completions back to back until `shutdown`.
async fn stream_forever(client: DemoClient, proxy: SocketAddr, worker: usize, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        let (model, max_tokens) = {
            let mut rng = rand::rng();
            (MODELS[worker % MODELS.len()], rng.random_range(16..=96))
        };
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "Tell me about latency."}],
            "max_tokens": max_tokens,
            "stream": true,
        });
        let request = Request::post(format!("http://{proxy}/v1/chat/completions"))
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

/// Output-token totals and the time of the previous print, for the tokens/s column.
struct Previous {
    tokens: BTreeMap<String, f64>,
    at: tokio::time::Instant,
}

/// Outcomes that count against the engine (not the client's own doing).
const ENGINE_ERRORS: [&str; 3] = ["upstream_error", "timeout", "connect_error"];

/// The table for one scrape.
fn render_table(text: &str, previous: &mut Previous) -> String {
    let exposition = Exposition::parse(text);
    let elapsed = std::mem::replace(&mut previous.at, tokio::time::Instant::now()).elapsed();
    let mut out = format!(
        "{:<16} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10}\n",
        "model", "requests", "errors", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tokens/s"
    );
    for model in MODELS {
        let requests = exposition.sum("llmslo_requests_total", model, None);
        let errors: f64 = ENGINE_ERRORS
            .iter()
            .map(|outcome| exposition.sum("llmslo_requests_total", model, Some(outcome)))
            .sum();
        let tokens = exposition.sum("llmslo_output_tokens_total", model, None);
        let before = previous.tokens.insert(model.to_string(), tokens).unwrap_or(0.0);
        let rate = (tokens - before) / elapsed.as_secs_f64().max(1e-3);
        let q = |name: &str, quantile: f64| {
            exposition
                .quantile(name, model, quantile)
                .map_or("-".to_string(), |s| format!("{:.1}ms", s * 1e3))
        };
        let ttft = "gen_ai_server_time_to_first_token_seconds_bucket";
        let tpot = "gen_ai_server_time_per_output_token_seconds_bucket";
        out += &format!(
            "{model:<16} {requests:>8} {errors:>8} {:>9} {:>9} {:>9} {:>9} {rate:>10.1}\n",
            q(ttft, 0.5),
            q(ttft, 0.99),
            q(tpot, 0.5),
            q(tpot, 0.99),
        );
    }
    out + "(requests include client_cancelled; errors are upstream_error, timeout and connect_error;\n \
           percentiles are what histogram_quantile computes from the exported buckets)\n\n"
}

/// A minimal reading of the text exposition: sample name, labels, value.
struct Exposition<'a> {
    samples: Vec<(&'a str, &'a str, f64)>,
}

impl<'a> Exposition<'a> {
    fn parse(text: &'a str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (name, labels) = series.split_once('{').unwrap_or((series, ""));
                Some((name, labels, value.parse().ok()?))
            })
            .collect();
        Self { samples }
    }

    fn label<'s>(labels: &'s str, key: &str) -> Option<&'s str> {
        let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
        let end = labels[start..].find('"')? + start;
        Some(&labels[start..end])
    }

    fn sum(&self, name: &str, model: &str, outcome: Option<&str>) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| {
                *n == name
                    && Self::label(labels, "model") == Some(model)
                    && outcome.is_none_or(|o| Self::label(labels, "outcome") == Some(o))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// `histogram_quantile` over every series of `model` in the `_bucket` family `name`.
    fn quantile(&self, name: &str, model: &str, q: f64) -> Option<f64> {
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for (n, labels, value) in &self.samples {
            if *n != name || Self::label(labels, "model") != Some(model) {
                continue;
            }
            let le = match Self::label(labels, "le")? {
                "+Inf" => f64::INFINITY,
                edge => edge.parse().ok()?,
            };
            buckets.entry(le.to_bits()).or_insert((le, 0.0)).1 += value;
        }
        let mut buckets: Vec<(f64, f64)> = buckets.into_values().collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last()?.1;
        if total == 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for (edge, count) in buckets {
            if count >= rank {
                if edge.is_infinite() {
                    return Some(lower.0);
                }
                let width = count - lower.1;
                let fraction = if width > 0.0 { (rank - lower.1) / width } else { 1.0 };
                return Some(lower.0 + (edge - lower.0) * fraction);
            }
            lower = (edge, count);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_like_prometheus() {
        let text = "h_bucket{le=\"0.1\",model=\"m\"} 50\nh_bucket{le=\"0.2\",model=\"m\"} 100\nh_bucket{le=\"+Inf\",model=\"m\"} 100\n";
        let e = Exposition::parse(text);
        assert!((e.quantile("h_bucket", "m", 0.5).unwrap() - 0.1).abs() < 1e-9);
        assert!((e.quantile("h_bucket", "m", 0.75).unwrap() - 0.15).abs() < 1e-9);
        assert_eq!(e.quantile("h_bucket", "other", 0.5), None);
    }

    #[test]
    fn sums_filter_by_model_and_outcome() {
        let text = "r_total{model=\"m\",outcome=\"success\"} 3\nr_total{model=\"m\",outcome=\"timeout\"} 1\n";
        let e = Exposition::parse(text);
        assert_eq!(e.sum("r_total", "m", None), 4.0);
        assert_eq!(e.sum("r_total", "m", Some("success")), 3.0);
    }
}
