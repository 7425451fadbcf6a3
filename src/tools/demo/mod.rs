//! `llmslo demo`: a continuous-batching simulated engine that reasons before it answers,
//! the sidecar in front of it, a streaming load over the chat, Responses and Messages APIs
//! that ramps up past the engine's knee and back, and a live view of what the sidecar
//! measures: exact latency percentiles from the sidecar's own per-request records (not from
//! bucket interpolation), and from its `/metrics` the counts and each SLO's attainment, burn
//! rate and budget.

mod feed;

use crate::config::Config;
use crate::quantile::nearest_rank;
use crate::record::RequestRecord;
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
use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
    let engine_listener = TcpListener::bind("127.0.0.1:0").await?;
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
    let period = config.slos.period;
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
                    render_slos(&text, share_of(started.elapsed(), period)),
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
}

/// The sidecar's exact figures (seconds) of the requests that finished over some span: per
/// model TTFT and TPOT, per API TTFT and time to the first answer token. Each list keeps its
/// latest [`Exact::KEEP`] values, so a days-long demo stays small.
#[derive(Debug, Default)]
struct Exact {
    by_model: BTreeMap<String, [VecDeque<f64>; 2]>,
    by_api: BTreeMap<&'static str, [VecDeque<f64>; 2]>,
    /// Records the demo fell too far behind to read.
    lost: u64,
}

impl Exact {
    const KEEP: usize = 100_000;

    fn add(&mut self, record: &RequestRecord) {
        let push = |list: &mut VecDeque<f64>, value: Option<Duration>| {
            if let Some(value) = value {
                if list.len() == Self::KEEP {
                    list.pop_front();
                }
                list.push_back(value.as_secs_f64());
            }
        };
        let [ttft, tpot] = self.by_model.entry(record.model.clone()).or_default();
        push(ttft, record.ttft);
        for choice in &record.tpot_per_choice {
            push(tpot, Some(*choice));
        }
        let [api_ttft, answer] = self.by_api.entry(record.operation.as_str()).or_default();
        push(api_ttft, record.ttft);
        push(answer, record.answer_ttft);
    }
}

/// Reads every record the sidecar publishes into each of `spans` until the sidecar stops.
async fn gather_records(mut records: tokio::sync::broadcast::Receiver<RequestRecord>, spans: [Arc<Mutex<Exact>>; 2]) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match records.recv().await {
            Ok(record) => spans
                .iter()
                .for_each(|s| s.lock().expect("demo records lock").add(&record)),
            Err(RecvError::Lagged(n)) => spans
                .iter()
                .for_each(|s| s.lock().expect("demo records lock").lost += n),
            Err(RecvError::Closed) => return,
        }
    }
}

/// The nearest-rank `q` quantile of `values`: a value the sidecar measured.
fn exact_quantile(values: Option<&VecDeque<f64>>, q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values?.iter().copied().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    Some(nearest_rank(&sorted, q))
}

/// Outcomes that count against the engine (not the client's own doing).
const ENGINE_ERRORS: [&str; 3] = ["upstream_error", "timeout", "connect_error"];

/// The table for one scrape: counts and token rates from `/metrics`, percentiles exact from
/// the sidecar's records in `exact`.
fn render_table(text: &str, previous: &mut Previous, exact: &Exact) -> String {
    let exposition = Exposition::parse(text);
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
        let [ttft, tpot] = match exact.by_model.get(model) {
            Some([ttft, tpot]) => [Some(ttft), Some(tpot)],
            None => [None, None],
        };
        let per_user = per_user_speed(tpot).map_or("-".to_string(), |v| format!("{v:.1}"));
        out += &format!(
            "{model:<16} {requests:>8} {errors:>8} {:>9} {:>9} {:>9} {:>9} {per_user:>10} {rate:>10.1}\n",
            ms(exact_quantile(ttft, 0.5)),
            ms(exact_quantile(ttft, 0.99)),
            ms(exact_quantile(tpot, 0.5)),
            ms(exact_quantile(tpot, 0.99)),
        );
    }
    out += "(requests and errors since the start, the rest since the last view; errors are upstream_error,\n \
            timeout and connect_error; percentiles are exact, the nearest rank of the sidecar's own per-request\n \
            figures, where histogram_quantile would interpolate inside a bucket; tok/s/user: mean of 1 / TPOT)\n";
    if exact.lost > 0 {
        out += &format!(
            "({} requests finished while the view was too far behind to read them)\n",
            exact.lost
        );
    }
    out + "\n"
}

/// Milliseconds, or `-` when there is no figure.
fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("-".to_string(), |s| format!("{:.1}ms", s * 1e3))
}

/// The streaming speed one user sees: the mean of 1 / TPOT, as `llmslo sweep` reports it.
fn per_user_speed(tpot: Option<&VecDeque<f64>>) -> Option<f64> {
    let speeds: Vec<f64> = tpot?.iter().filter(|t| **t > 0.0).map(|t| 1.0 / t).collect();
    (!speeds.is_empty()).then(|| speeds.iter().sum::<f64>() / speeds.len() as f64)
}

/// Per API: requests since the start, and, over the requests since the last view, the median
/// wait for the first token beside the median wait for the first token of the answer (after the
/// reasoning), exact.
fn render_apis(text: &str, exact: &Exact) -> String {
    let exposition = Exposition::parse(text);
    let mut out = format!(
        "{:<16} {:>8} {:>9} {:>12}\n",
        "API", "requests", "TTFT p50", "answer p50"
    );
    for (_, operation) in APIS {
        let [ttft, answer] = match exact.by_api.get(operation) {
            Some([ttft, answer]) => [Some(ttft), Some(answer)],
            None => [None, None],
        };
        out += &format!(
            "{operation:<16} {:>8} {:>9} {:>12}\n",
            exposition.sum("llmslo_requests_total", &[("operation", operation)]),
            ms(exact_quantile(ttft, 0.5)),
            ms(exact_quantile(answer, 0.5)),
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
/// Why each SLO burned so far (every bad event's cause, all models), and the engine's own
/// queue and batch as its `/metrics` states them.
fn render_causes(text: &str) -> String {
    let exposition = Exposition::parse(text);
    let mut by_slo: BTreeMap<&str, BTreeMap<&str, f64>> = BTreeMap::new();
    for (name, labels, value) in &exposition.samples {
        if *name != "llmslo_slo_bad_events_by_cause_total" {
            continue;
        }
        if let (Some(slo), Some(cause)) = (Exposition::label(labels, "slo"), Exposition::label(labels, "cause")) {
            *by_slo.entry(slo).or_default().entry(cause).or_default() += value;
        }
    }
    let mut out = String::new();
    for (slo, causes) in by_slo {
        let total: f64 = causes.values().sum();
        let mut shares: Vec<(&str, f64)> = causes.into_iter().filter(|(_, n)| *n > 0.0).collect();
        shares.sort_by(|a, b| b.1.total_cmp(&a.1));
        let shares: Vec<String> = shares
            .iter()
            .map(|(cause, n)| format!("{cause} {:.0}%", n / total * 100.0))
            .collect();
        out += &format!("why {slo:<12} {total:.0} bad events: {}\n", shares.join(", "));
    }
    let gauge = |name: &str| {
        exposition
            .gauge(name, &[], None)
            .map_or("-".to_string(), |v| format!("{v:.0}"))
    };
    out += &format!(
        "engine           {} waiting, {} running (its own /metrics)\n",
        gauge("llmslo_engine_requests_waiting"),
        gauge("llmslo_engine_requests_running"),
    );
    out
}

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
    let gauge = |name: &str| exposition.gauge(name, &[], None);
    let per_slo: Vec<String> = exposition
        .samples
        .iter()
        .filter(|(name, _, _)| *name == "llmslo_capacity_requests_per_second")
        .filter_map(|(_, labels, c)| Some(format!("{} {}", Exposition::label(labels, "slo")?, num(Some(*c)))))
        .collect();
    out += &format!(
        "capacity engine  knee {} requests/s at {} in flight ({}), load {} requests/s, saturation {}\n",
        num(gauge("llmslo_capacity_knee_requests_per_second")),
        num(gauge("llmslo_capacity_knee_concurrency")),
        per_slo.join(", "),
        num(gauge("llmslo_capacity_load_requests_per_second")),
        pct(gauge("llmslo_slo_saturation_ratio")),
    );
    out + "(\"-\": fewer than min_events requests in the window yet, or for capacity too little spread in load; \
           burn rate 1 spends the budget in exactly its period; budget spent: of the whole period's, so far)\n\n"
}

/// The widest the view is drawn: it fits a 120-column terminal.
const WIDTH: usize = 120;

/// `text` with every line longer than `width` broken at its last space that fits, the rest
/// indented by four.
fn fit_width(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (mut rest, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let mut indent = "";
        while indent.len() + rest.chars().count() > width {
            // Up to and with the first character past the width: a space there still fits.
            let fits = rest
                .char_indices()
                .nth(width - indent.len())
                .map_or(rest.len(), |(i, c)| i + c.len_utf8());
            let Some(cut) = rest[..fits].rfind(' ').filter(|&cut| cut > 0) else {
                break;
            };
            out.push_str(indent);
            out.push_str(rest[..cut].trim_end());
            out.push('\n');
            rest = rest[cut..].trim_start();
            indent = "    ";
        }
        out.push_str(indent);
        out.push_str(rest);
        out.push_str(newline);
    }
    out
}

/// How much of the SLO period `uptime` is (at most all of it).
fn share_of(uptime: Duration, period: Duration) -> f64 {
    uptime.min(period).as_secs_f64() / period.as_secs_f64()
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_broken_at_a_space_to_fit_the_width() {
        let text = "short\nfirst second third fourth fifth\nunbreakable-long-word\n";
        assert_eq!(
            fit_width(text, 16),
            "short\nfirst second\n    third fourth\n    fifth\nunbreakable-long-word\n"
        );
        assert_eq!(fit_width("no newline at the end", 100), "no newline at the end");
    }

    #[test]
    fn the_load_ramps_up_to_the_peak_and_back() {
        let at = |secs: u64| clients_at(Duration::from_secs(secs), 40, Duration::from_secs(120));
        assert_eq!(at(0), 5, "an eighth of the peak");
        assert_eq!(at(60), 40, "the peak half-way");
        assert_eq!(at(30), 23);
        assert_eq!(at(120), 5, "and back");
        assert_eq!(clients_at(Duration::from_secs(7), 40, Duration::ZERO), 40, "no ramp");
    }

    fn record(model: &str, operation: crate::record::Operation, ttft_ms: f64, tpot_ms: f64) -> RequestRecord {
        RequestRecord {
            model: model.into(),
            operation,
            outcome: crate::record::Outcome::Success,
            ttft: Some(Duration::from_secs_f64(ttft_ms / 1e3)),
            answer_ttft: Some(Duration::from_secs_f64(2.0 * ttft_ms / 1e3)),
            tpot_per_choice: vec![Duration::from_secs_f64(tpot_ms / 1e3)],
            e2e: Duration::from_secs(1),
            output_tokens: Some(32),
            input_tokens: Some(8),
            reasoning_tokens: None,
            token_events: 32,
            count_source: None,
            load: None,
            engine: None,
            engine_context: None,
            trace: None,
            provider: None,
            unmeasured: None,
        }
    }

    /// The TTFT p50, TTFT p99, TPOT p50 and TPOT p99 cells of `model`'s row, in ms.
    fn cells(table: &str, model: &str) -> Vec<f64> {
        let row = table.lines().find(|l| l.starts_with(model)).unwrap();
        row.split_whitespace()
            .filter_map(|c| c.strip_suffix("ms"))
            .map(|c| c.parse().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn the_tables_percentiles_are_the_exact_ones() {
        use crate::record::Operation;
        let mut exact = Exact::default();
        // A constant 30 ms TPOT (which classic buckets read as 49.75 ms at p99) for one model,
        // a long-tailed one (median 30 ms, p99 near 80 ms) for the other.
        let tailed: Vec<f64> = (0..1000)
            .map(|i| 30.0 * (f64::from(i) / 1000.0 * 2.7).exp().powf(0.37))
            .collect();
        for (i, tpot) in tailed.iter().enumerate() {
            exact.add(&record(MODELS[0], Operation::Chat, 200.0, 30.0));
            exact.add(&record(MODELS[1], Operation::Responses, 100.0 + i as f64 / 10.0, *tpot));
        }
        let mut previous = Previous {
            tokens: BTreeMap::new(),
            at: tokio::time::Instant::now(),
        };
        let table = render_table("", &mut previous, &exact);
        assert_eq!(cells(&table, MODELS[0]), [200.0, 200.0, 30.0, 30.0], "{table}");
        let mut sorted = tailed.clone();
        sorted.sort_by(f64::total_cmp);
        let want = [
            100.0 + 499.0 / 10.0,
            100.0 + 989.0 / 10.0,
            nearest_rank(&sorted, 0.5),
            nearest_rank(&sorted, 0.99),
        ];
        for (got, want) in cells(&table, MODELS[1]).iter().zip(want) {
            assert!((got - want).abs() / want < 0.01, "{got} against {want}:\n{table}");
        }
        let apis = render_apis("", &exact);
        let chat = apis.lines().find(|l| l.starts_with("chat")).unwrap();
        assert!(chat.contains("200.0ms") && chat.contains("400.0ms"), "{apis}");
    }

    #[test]
    fn the_kept_figures_are_bounded() {
        use crate::record::Operation;
        let mut exact = Exact::default();
        for _ in 0..Exact::KEEP + 10 {
            exact.add(&record("m", Operation::Chat, 1.0, 1.0));
        }
        assert!(exact.by_model["m"].iter().all(|l| l.len() == Exact::KEEP));
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
