//! `llmslo demo`: a continuous-batching simulated engine that reasons before it answers,
//! the sidecar in front of it, a streaming load over the chat, Responses and Messages APIs
//! that ramps up past the engine's knee and back, and a live view of what the sidecar
//! measures, read from its own `/metrics`: latency percentiles the way Prometheus's
//! `histogram_quantile` computes them, and each SLO's attainment, burn rate and budget.

use crate::config::Config;
use crate::sidecar::{termination_signal, Sidecar};
use crate::tools::simulate::batching::BatchingOptions;
use crate::tools::simulate::{SimEngine, SimOptions};
use bytes::Bytes;
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
use std::sync::Arc;
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
    let engine_listener = TcpListener::bind("127.0.0.1:0").await?;
    let engine_addr = engine_listener.local_addr()?;
    let engine = SimEngine::new(SimOptions {
        models: MODELS.iter().map(|m| m.to_string()).collect(),
        // Rare engine faults: the availability SLO stays healthy, the TPOT SLO tells the story.
        error_rate: 0.0005,
        midstream_error_rate: 0.0005,
        batching: Some(DEMO_BATCHING),
        reasoning_tokens: REASONING_TOKENS,
        ..SimOptions::default()
    });
    let engine_task = tokio::spawn(engine.serve(engine_listener, shutdown.clone()));

    // The example SLOs and a simulated GPU, so every dashboard panel has data.
    let mut config = Config::from_yaml(&format!(
        "upstream: http://{engine_addr}\nengine: vllm\nhealth_interval: 1s\nservice: chat\n{EXAMPLE_SLOS}gpu: {{simulated: true}}\n"
    ))?;
    config.listen = options.listen;
    config.metrics_listen = options.metrics_listen;
    let period = config.slos.period;
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
        text: String::new(),
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
                let view = format!(
                    "{:.0?} in, {clients} of {} clients streaming\n\n{}{}{}",
                    started.elapsed(),
                    options.concurrency,
                    render_table(&text, &mut previous),
                    render_apis(&text),
                    render_slos(&text, share_of(started.elapsed(), period)),
                );
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
    shutdown.cancel();
    while load.join_next().await.is_some() {}
    let mut whole_run = Previous {
        tokens: BTreeMap::new(),
        at: started,
        text: String::new(),
    };
    println!("whole run ({:.0?}):", started.elapsed());
    print!("{}", render_table(&text, &mut whole_run));
    sidecar.shutdown().await;
    let _ = engine_task.await;
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

/// Output-token totals and the time of the previous print, for the tokens/s column.
struct Previous {
    tokens: BTreeMap<String, f64>,
    at: tokio::time::Instant,
    /// The previous scrape, so percentiles cover only what happened since.
    text: String,
}

/// Outcomes that count against the engine (not the client's own doing).
const ENGINE_ERRORS: [&str; 3] = ["upstream_error", "timeout", "connect_error"];

/// The table for one scrape.
fn render_table(text: &str, previous: &mut Previous) -> String {
    let exposition = Exposition::parse(text);
    let earlier_text = std::mem::replace(&mut previous.text, text.to_string());
    let earlier = Exposition::parse(&earlier_text);
    let elapsed = std::mem::replace(&mut previous.at, tokio::time::Instant::now()).elapsed();
    let mut out = format!(
        "{:<16} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}\n",
        "model", "requests", "errors", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tok/s/user", "tokens/s"
    );
    for model in MODELS {
        let of_model = [("model", model)];
        let requests = exposition.sum("llmslo_requests_total", &of_model);
        let errors: f64 = ENGINE_ERRORS
            .iter()
            .map(|outcome| exposition.sum("llmslo_requests_total", &[("model", model), ("outcome", outcome)]))
            .sum();
        let tokens = exposition.sum("llmslo_output_tokens_total", &of_model);
        let before = previous.tokens.insert(model.to_string(), tokens).unwrap_or(0.0);
        let rate = (tokens - before) / elapsed.as_secs_f64().max(1e-3);
        let q = |name: &str, quantile: f64| exposition.quantile_since(&earlier, name, &of_model, quantile);
        let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.1}ms", s * 1e3));
        let ttft = "gen_ai_server_time_to_first_token_seconds_bucket";
        let tpot = "gen_ai_server_time_per_output_token_seconds_bucket";
        let per_user = q(tpot, 0.5).map_or("-".to_string(), |s| format!("{:.1}", 1.0 / s));
        out += &format!(
            "{model:<16} {requests:>8} {errors:>8} {:>9} {:>9} {:>9} {:>9} {per_user:>10} {rate:>10.1}\n",
            ms(q(ttft, 0.5)),
            ms(q(ttft, 0.99)),
            ms(q(tpot, 0.5)),
            ms(q(tpot, 0.99)),
        );
    }
    out + "(requests and errors since the start, the rest since the last view; errors are upstream_error,\n \
           timeout and connect_error; percentiles as histogram_quantile computes them from the buckets)\n\n"
}

/// Per API since the start: requests, and the median wait for the first token beside the
/// median wait for the first token of the answer (after the reasoning).
fn render_apis(text: &str) -> String {
    let exposition = Exposition::parse(text);
    let nothing = Exposition { samples: Vec::new() };
    let mut out = format!(
        "{:<16} {:>8} {:>9} {:>12}\n",
        "API", "requests", "TTFT p50", "answer p50"
    );
    for (_, operation) in APIS {
        let of_api = [("operation", operation)];
        let q = |name: &str| exposition.quantile_since(&nothing, name, &of_api, 0.5);
        let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.1}ms", s * 1e3));
        out += &format!(
            "{operation:<16} {:>8} {:>9} {:>12}\n",
            exposition.sum("llmslo_requests_total", &of_api),
            ms(q("gen_ai_server_time_to_first_token_seconds_bucket")),
            ms(q("llmslo_time_to_first_answer_token_seconds_bucket")),
        );
    }
    out + &format!(
        "(the engine reasons for {REASONING_TOKENS} tokens before each answer: the answer's first token comes later)\n\n"
    )
}

/// Each SLO's state per model: good events over the last 5 minutes, burn rate over 5m and 1h,
/// error budget left; then goodput.
///
/// The budget column is the share of the whole period's error budget spent so far: the
/// sidecar's budget-remaining gauge judges the budget over the uptime (a young process that
/// saw 5 bad requests in 10 s reads -3700 %), which is right for alerting and unreadable here.
/// `period_share` is the uptime over the period.
fn render_slos(text: &str, period_share: f64) -> String {
    let exposition = Exposition::parse(text);
    let mut slos: Vec<&str> = exposition
        .samples
        .iter()
        .filter(|(n, _, _)| *n == "llmslo_slo_error_budget_remaining_ratio")
        .filter_map(|(_, labels, _)| Exposition::label(labels, "slo"))
        .collect();
    slos.dedup();
    let pct = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0))
    };
    // A young process spends hundredths of a percent of a month's budget.
    let small_pct = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".to_string(), |v| format!("{:.3}%", v * 100.0))
    };
    let num = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".to_string(), |v| format!("{v:.2}"))
    };
    let mut out = format!(
        "{:<16} {:<16} {:>9} {:>8} {:>8} {:>12}\n",
        "SLO", "model", "good 5m", "burn 5m", "burn 1h", "budget spent"
    );
    for slo in slos {
        for model in MODELS {
            let gauge =
                |name: &str, window: Option<&str>| exposition.gauge(name, &[("slo", slo), ("model", model)], window);
            out += &format!(
                "{slo:<16} {model:<16} {:>9} {:>8} {:>8} {:>12}\n",
                pct(gauge("llmslo_slo_error_ratio", Some("5m")).map(|r| 1.0 - r)),
                num(gauge("llmslo_slo_burn_rate", Some("5m"))),
                num(gauge("llmslo_slo_burn_rate", Some("1h"))),
                small_pct(
                    gauge("llmslo_slo_error_budget_remaining_ratio", None).map(|left| (1.0 - left) * period_share)
                ),
            );
        }
    }
    for model in MODELS {
        let gauge = |name: &str| exposition.gauge(name, &[("model", model)], Some("5m"));
        out += &format!(
            "goodput {model:<16} {} requests/s, {} tokens/s, {} of valid requests meet every goodput SLO\n",
            num(gauge("llmslo_goodput_requests_per_second")),
            num(gauge("llmslo_goodput_output_tokens_per_second")),
            pct(gauge("llmslo_slo_attainment_ratio")),
        );
    }
    for model in MODELS {
        let gauge = |name: &str| exposition.gauge(name, &[("model", model)], None);
        let per_slo: Vec<String> = slos_of(&exposition, "llmslo_capacity_concurrency", model)
            .into_iter()
            .map(|(slo, c)| format!("{slo} {}", num(Some(c))))
            .collect();
        out += &format!(
            "capacity {model:<15} knee {} in flight ({}), load {}, saturation {}\n",
            num(gauge("llmslo_capacity_knee_concurrency")),
            per_slo.join(", "),
            num(gauge("llmslo_capacity_load_concurrency")),
            pct(gauge("llmslo_slo_saturation_ratio")),
        );
    }
    out + "(\"-\": fewer than min_events requests in the window yet, or for capacity too little spread in load; \
           burn rate 1 spends the budget in exactly its period; budget spent: of the whole period's, so far)\n\n"
}

/// How much of the SLO period `uptime` is (at most all of it).
fn share_of(uptime: Duration, period: Duration) -> f64 {
    uptime.min(period).as_secs_f64() / period.as_secs_f64()
}

/// `(slo, value)` of each series of the per-SLO gauge `name` for `model`.
fn slos_of<'a>(exposition: &Exposition<'a>, name: &str, model: &str) -> Vec<(&'a str, f64)> {
    exposition
        .samples
        .iter()
        .filter(|(n, labels, _)| *n == name && Exposition::label(labels, "model") == Some(model))
        .filter_map(|(_, labels, v)| Some((Exposition::label(labels, "slo")?, *v)))
        .collect()
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

    /// The value of label `key` (a whole name: `slo` is not `slo_service`).
    fn label<'s>(labels: &'s str, key: &str) -> Option<&'s str> {
        let pattern = format!("{key}=\"");
        let at = labels
            .match_indices(&pattern)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || labels.as_bytes()[i - 1] == b',')?;
        let start = at + pattern.len();
        let end = labels[start..].find('"')? + start;
        Some(&labels[start..end])
    }

    /// The value of the gauge `name` whose labels include `labels` (and `window`, when given).
    fn gauge(&self, name: &str, labels: &[(&str, &str)], window: Option<&str>) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| {
                *n == name
                    && labels.iter().all(|(k, v)| Self::label(l, k) == Some(v))
                    && window.is_none_or(|w| Self::label(l, "window") == Some(w))
            })
            .map(|(_, _, v)| *v)
    }

    /// Whether `labels` include every one of `wanted`.
    fn matches(labels: &str, wanted: &[(&str, &str)]) -> bool {
        wanted.iter().all(|(k, v)| Self::label(labels, k) == Some(v))
    }

    /// The sum of every sample of `name` whose labels include `wanted`.
    fn sum(&self, name: &str, wanted: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, labels, _)| *n == name && Self::matches(labels, wanted))
            .map(|(_, _, v)| v)
            .sum()
    }

    /// `histogram_quantile` over every series of the `_bucket` family `name` whose labels
    /// include `wanted`, counting only what the buckets gained since `earlier` (an earlier
    /// scrape, or nothing).
    fn quantile_since(&self, earlier: &Exposition, name: &str, wanted: &[(&str, &str)], q: f64) -> Option<f64> {
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for (exposition, sign) in [(self, 1.0), (earlier, -1.0)] {
            for (n, labels, value) in &exposition.samples {
                if *n != name || !Self::matches(labels, wanted) {
                    continue;
                }
                let le = match Self::label(labels, "le")? {
                    "+Inf" => f64::INFINITY,
                    edge => edge.parse().ok()?,
                };
                buckets.entry(le.to_bits()).or_insert((le, 0.0)).1 += sign * value;
            }
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
    fn the_load_ramps_up_to_the_peak_and_back() {
        let at = |secs: u64| clients_at(Duration::from_secs(secs), 40, Duration::from_secs(120));
        assert_eq!(at(0), 5, "an eighth of the peak");
        assert_eq!(at(60), 40, "the peak half-way");
        assert_eq!(at(30), 23);
        assert_eq!(at(120), 5, "and back");
        assert_eq!(clients_at(Duration::from_secs(7), 40, Duration::ZERO), 40, "no ramp");
    }

    #[test]
    fn quantile_interpolates_like_prometheus() {
        let text = "h_bucket{le=\"0.1\",model=\"m\"} 50\nh_bucket{le=\"0.2\",model=\"m\"} 100\nh_bucket{le=\"+Inf\",model=\"m\"} 100\n";
        let e = Exposition::parse(text);
        let nothing = Exposition { samples: Vec::new() };
        let m = [("model", "m")];
        assert!((e.quantile_since(&nothing, "h_bucket", &m, 0.5).unwrap() - 0.1).abs() < 1e-9);
        assert!((e.quantile_since(&nothing, "h_bucket", &m, 0.75).unwrap() - 0.15).abs() < 1e-9);
        assert_eq!(e.quantile_since(&nothing, "h_bucket", &[("model", "other")], 0.5), None);
        // Since an earlier scrape that held the first 50 (all under 0.1): the rest are in (0.1, 0.2].
        let earlier = Exposition::parse("h_bucket{le=\"0.1\",model=\"m\"} 50\nh_bucket{le=\"0.2\",model=\"m\"} 50\nh_bucket{le=\"+Inf\",model=\"m\"} 50\n");
        assert!((e.quantile_since(&earlier, "h_bucket", &m, 0.5).unwrap() - 0.15).abs() < 1e-9);
    }

    #[test]
    fn labels_are_matched_by_whole_name_and_the_budget_is_the_periods() {
        let labels = "slo_service=\"chat\",slo=\"tpot\",model=\"m\"";
        assert_eq!(Exposition::label(labels, "slo"), Some("tpot"));
        assert_eq!(Exposition::label(labels, "service"), None);
        let text = "llmslo_slo_error_budget_remaining_ratio{slo_service=\"chat\",slo=\"tpot\",model=\"llama-sim-8b\"} -37.46\n";
        // 10 s into a 30-day period, a budget overspent 38.46 times over the uptime is a sliver
        // of the month's.
        let share = share_of(Duration::from_secs(10), Duration::from_secs(30 * 86_400));
        let view = render_slos(text, share);
        assert!(view.contains("budget spent") && view.contains(" 0.015%"), "{view}");
        assert!(!view.contains("-3746"), "{view}");
    }

    #[test]
    fn sums_filter_by_model_and_outcome() {
        let text = "r_total{model=\"m\",outcome=\"success\"} 3\nr_total{model=\"m\",outcome=\"timeout\"} 1\n";
        let e = Exposition::parse(text);
        assert_eq!(e.sum("r_total", &[("model", "m")]), 4.0);
        assert_eq!(e.sum("r_total", &[("model", "m"), ("outcome", "success")]), 3.0);
    }
}
