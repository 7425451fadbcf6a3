//! Live capacity proven against the truth on the batching simulator. In each case one run
//! measures both on the same engine and arrival process:
//! - the truth: `llmslo sweep --rate` steps across the knee; the highest rate whose attainment
//!   meets every required objective (interpolated between the last step that met them and the
//!   first that did not);
//! - the estimate: live traffic through the sidecar at 20 %, 40 % and 60 % of that rate, then
//!   120 %, then 50 %, with the gauges scraped every 5 s.
//!
//! The capacity (as a rate) must be within ±15 % of the truth and the saturation within ±0.1
//! of the offered rate over the true knee rate; after each step in load the saturation must
//! settle within 30 s; a pod at half its knee never reads 0.9, one at 120 % reads at least 1.

use crate::common::{knee_40_engine, start_engine, start_sidecar};
use llmslo::tools::simulate::batching::BatchingOptions;
use llmslo::tools::simulate::SimOptions;
use llmslo::tools::sweep::client::Endpoint;
use llmslo::tools::sweep::load::{Arrivals, Bursts};
use llmslo::tools::sweep::report::Report;
use llmslo::tools::sweep::{LoadPlan, SweepOptions, Workload};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// One way the engine and its traffic can be.
struct Case {
    /// The SLOs' objective, in percent.
    objective: u32,
    /// The simulator's prefill cost per prompt token.
    prefill_per_token: Duration,
    /// The simulator's step jitter (0: every step lasts exactly its cost).
    step_jitter: f64,
    /// On/off arrivals instead of steady Poisson ones.
    bursts: Option<Bursts>,
    /// The models sharing the engine; each gets an equal share of the traffic.
    models: &'static [&'static str],
    /// The rates the truth is searched over (requests per second).
    rates: Vec<f64>,
    /// How far the capacity may stray from the truth at 20, 40 and 60 % of it.
    capacity_tolerance: f64,
}

/// TPOT within 30 ms and TTFT within 1 s: the batching simulator's TPOT is 10 + 0.5·C ms.
const BASELINE: Case = Case {
    objective: 95,
    prefill_per_token: Duration::ZERO,
    step_jitter: 0.0,
    bursts: None,
    models: &["sim"],
    rates: Vec::new(),
    capacity_tolerance: 0.15,
};

/// The prompts' length: at the knee (about one arrival per 30 ms step), 150 µs a token stalls
/// each step about 10 ms, a third of it.
const PROMPT_TOKENS: u32 = 64;
const OUTPUT_TOKENS: u32 = 32;
/// How long each truth step is measured, after its warm-up.
const TRUTH_STEP: Duration = Duration::from_secs(30);
/// The live phases: a share of the true knee rate, held this long. The first starts cold:
/// the model needs its first requests with a clear slope (500 of them for a 99 % objective).
const PHASES: [(f64, Duration); 5] = [
    (0.2, Duration::from_secs(180)),
    (0.4, Duration::from_secs(60)),
    (0.6, Duration::from_secs(60)),
    (1.2, Duration::from_secs(60)),
    (0.5, Duration::from_secs(60)),
];
/// How often the gauges are read.
const SCRAPE_EVERY: Duration = Duration::from_secs(5);
/// The saturation must be within ±0.1 of the truth this long after a step in load.
const SETTLE: Duration = Duration::from_secs(30);

fn slos(objective: u32) -> String {
    format!(
        "slos:\n  - {{name: tpot-30ms, objective: {objective}, tpot: 30ms}}\n  \
         - {{name: ttft-1s, objective: {objective}, ttft: 1s}}\n  \
         - {{name: availability, objective: 99, availability: true}}\n\
         goodput: {{require: [tpot-30ms, ttft-1s]}}\n"
    )
}

fn engine(case: &Case) -> SimOptions {
    let mut options = knee_40_engine();
    options.batching = Some(BatchingOptions {
        prefill_per_token: case.prefill_per_token,
        step_jitter: case.step_jitter,
        ..options.batching.unwrap()
    });
    options.models = case.models.iter().map(|m| m.to_string()).collect();
    options.seed = 11;
    options
}

/// Offers `rates` to `target`, every model its share at once, each step `warmup` then
/// `duration`; one report per model.
async fn offer(target: SocketAddr, case: &Case, rates: &[f64], warmup: Duration, duration: Duration) -> Vec<Report> {
    // One file per call: the cases run side by side.
    static FILES: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "llmslo-capacity-{}-{}.yaml",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, slos(case.objective)).unwrap();
    let share = case.models.len() as f64;
    let mut sweeps = tokio::task::JoinSet::new();
    for (i, model) in case.models.iter().enumerate() {
        let options = SweepOptions {
            target: format!("http://{target}"),
            slos: llmslo::config::Config::slos_from_file(&path).unwrap(),
            model: Some(model.to_string()),
            endpoint: Endpoint::Chat,
            api_key: None,
            loads: LoadPlan::Rate(rates.iter().map(|r| r / share).collect()),
            warmup,
            duration,
            prompt_tokens: PROMPT_TOKENS,
            output_tokens: OUTPUT_TOKENS,
            dataset: None,
            ignore_eos: true,
            request_timeout: Duration::from_secs(60),
            ca_cert: None,
            seed: 7 + 1000 * i as u64 + (rates[0] * 10.0) as u64,
            arrivals: case.bursts.map(Arrivals::Bursts).unwrap_or_default(),
            workload: Workload::Fixed,
            gpu_hour_price: None,
        };
        sweeps.spawn(async move {
            let report = llmslo::tools::sweep::run(options).await;
            (i, report.unwrap_or_else(|e| panic!("{e}")))
        });
    }
    let mut reports = sweeps.join_all().await;
    reports.sort_by_key(|(i, _)| *i);
    reports.into_iter().map(|(_, r)| r).collect()
}

/// The highest rate whose attainment meets every required objective, on a fresh engine.
async fn truth(case: &Case) -> f64 {
    let (engine, stop) = start_engine(engine(case)).await;
    let reports = offer(engine, case, &case.rates, Duration::from_secs(3), TRUTH_STEP).await;
    stop.cancel();
    let objective = f64::from(case.objective) / 100.0;
    // Per step: the smallest margin of a required SLO's attainment over its objective, over
    // every model's requests.
    let margins: Vec<f64> = (0..case.rates.len())
        .map(|step| {
            let required = reports[0].steps[step]
                .attainment
                .iter()
                .enumerate()
                .filter(|(_, a)| a.required);
            required
                .map(|(j, _)| {
                    let (good, valid) = reports.iter().fold((0, 0), |(g, v), r| {
                        let a = &r.steps[step].attainment[j];
                        (g + a.good, v + a.valid)
                    });
                    good as f64 / valid as f64 - objective
                })
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    if std::env::var("CAPACITY_DEBUG").is_ok() {
        eprintln!("margins over {:?}: {margins:?}", case.rates);
    }
    // The first miss that the next step confirms (one step's attainment is noisy near the
    // knee), interpolated from the step before it.
    let miss = (1..margins.len()).find(|&k| margins[k] < 0.0 && margins.get(k + 1).is_none_or(|m| *m < 0.0));
    let Some(miss) = miss.filter(|_| margins[0] >= 0.0) else {
        panic!("the knee is not within {:?}: margins {margins:?}", case.rates);
    };
    let (low, high) = (case.rates[miss - 1], case.rates[miss]);
    let (above, below) = (margins[miss - 1].max(0.0), margins[miss]);
    low + (high - low) * above / (above - below)
}

/// What one scrape read.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    at: Instant,
    saturation: f64,
    knee_requests_per_second: f64,
    load_requests_per_second: f64,
    /// The TPOT model's stall: seconds of each step lost per request arriving per second.
    stall: f64,
}

/// The value of the series `name{labels}` (`name` alone when `labels` is empty) in the
/// exposition `text`.
fn gauge(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

/// Runs the live phases at shares of `knee` through a sidecar; returns each phase's start and
/// every scrape.
async fn live(case: &Case, knee: f64) -> (Vec<Instant>, Vec<Scrape>) {
    let (engine, stop) = start_engine(engine(case)).await;
    // A five-minute window: every phase is heard in full (a 99 % objective needs 500 requests).
    let config = format!("{}capacity:\n  window: 5m\n", slos(case.objective));
    let sidecar = start_sidecar(engine, &config).await;
    let scrapes = Arc::new(Mutex::new(Vec::new()));
    let scraper = tokio::spawn({
        let (metrics, scrapes) = (sidecar.metrics.clone(), scrapes.clone());
        async move {
            loop {
                tokio::time::sleep(SCRAPE_EVERY).await;
                let text = metrics.encode();
                scrapes.lock().unwrap().push(Scrape {
                    at: Instant::now(),
                    saturation: gauge(&text, "llmslo_slo_saturation_ratio", ""),
                    knee_requests_per_second: gauge(&text, "llmslo_capacity_knee_requests_per_second", ""),
                    load_requests_per_second: gauge(&text, "llmslo_capacity_load_requests_per_second", ""),
                    stall: gauge(&text, "llmslo_latency_model_tpot_seconds", "term=\"stall\""),
                });
            }
        }
    });
    let mut starts = Vec::new();
    for (share, length) in PHASES {
        starts.push(Instant::now());
        offer(sidecar.proxy_addr, case, &[share * knee], Duration::ZERO, length).await;
    }
    starts.push(Instant::now());
    scraper.abort();
    stop.cancel();
    let scrapes = scrapes.lock().unwrap().clone();
    (starts, scrapes)
}

/// Measures the truth and the estimate for `case` and checks every requirement.
async fn prove(name: &str, case: Case) {
    let knee = truth(&case).await;
    let (starts, scrapes) = live(&case, knee).await;
    let in_phase = |i: usize| {
        let (from, to) = (starts[i], starts[i + 1]);
        scrapes.iter().filter(move |s| s.at > from && s.at <= to)
    };
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for (i, (share, length)) in PHASES.iter().enumerate() {
        // The readings once the phase has settled: the last 30 s.
        let settled: Vec<&Scrape> = in_phase(i).filter(|s| s.at - starts[i] >= *length - SETTLE).collect();
        let mean = |f: fn(&Scrape) -> f64| settled.iter().map(|s| f(s)).sum::<f64>() / settled.len() as f64;
        let (saturation, capacity) = (mean(|s| s.saturation), mean(|s| s.knee_requests_per_second));
        // Whether a reading says what it should at this share of the knee.
        let right = |s: &Scrape| match share {
            x if *x > 1.0 => s.saturation >= 1.0,
            _ => near(s.saturation, *share, 0.1),
        };
        let settle = in_phase(i).find(|s| right(s)).map(|s| s.at - starts[i]);
        table.push(format!(
            "{:>3.0} %: capacity {capacity:.1} req/s ({:+.0} %), saturation {saturation:.2} (readings {:.2}-{:.2}), \
             right after {}",
            share * 100.0,
            (capacity / knee - 1.0) * 100.0,
            settled.iter().map(|s| s.saturation).fold(f64::INFINITY, f64::min),
            settled.iter().map(|s| s.saturation).fold(f64::NEG_INFINITY, f64::max),
            settle.map_or("never".into(), |d| format!("{} s", d.as_secs()))
        ));
        if i > 0 && settle.is_none_or(|d| d > SETTLE) {
            failures.push(format!("{share}: not right within {SETTLE:?} of the step"));
        }
        if [0.2, 0.4, 0.6].contains(share) {
            if !near(saturation, *share, 0.1) {
                failures.push(format!("{share}: saturation {saturation}"));
            }
            if let Some(s) = settled
                .iter()
                .find(|s| !near(s.knee_requests_per_second / knee, 1.0, case.capacity_tolerance))
            {
                failures.push(format!("{share}: capacity {s:?}"));
            }
        }
        let after_step = in_phase(i).filter(|s| s.at - starts[i] >= SETTLE);
        if *share == 0.5 && after_step.clone().any(|s| !below(s.saturation, 0.9)) {
            failures.push(format!("half the knee read 0.9 or more: {settled:?}"));
        }
        if *share > 1.0
            && after_step
                .clone()
                .any(|s| below(s.saturation, 1.0) || s.saturation.is_nan())
        {
            failures.push(format!("120 % of the knee read under 1: {settled:?}"));
        }
    }
    if std::env::var("CAPACITY_DEBUG").is_ok() {
        for s in &scrapes {
            eprintln!(
                "{:?} sat {:.3} knee {:.2} load {:.2}",
                s.at - starts[0],
                s.saturation,
                s.knee_requests_per_second,
                s.load_requests_per_second
            );
        }
    }
    // Each prompt admitted costs its prefill in the step: the stall per arrival per second.
    // (A noisy engine's TPOT noise also sits in the fit's arrivals × TPOT term and reads as a
    // small stall there: an early reading, not checked.)
    let stall = scrapes.last().expect("scrapes").stall;
    let true_stall = case.prefill_per_token.as_secs_f64() * f64::from(PROMPT_TOKENS);
    if case.step_jitter == 0.0 && !near(stall, true_stall, 0.2 * true_stall) {
        failures.push(format!(
            "the fitted stall {stall} s against the engine's {true_stall} s"
        ));
    }
    let report = format!(
        "{name}: true knee {knee:.1} req/s, stall {:.1} ms\n  {}",
        stall * 1e3,
        table.join("\n  ")
    );
    eprintln!("{report}");
    assert!(failures.is_empty(), "{report}\n{}", failures.join("\n"));
}

/// Whether `value` is within `tolerance` of `expected` (never for NaN).
fn near(value: f64, expected: f64, tolerance: f64) -> bool {
    (value - expected).abs() <= tolerance
}

/// Whether `value` is below `limit` (never for NaN).
fn below(value: f64, limit: f64) -> bool {
    value < limit
}

fn around(low: f64, high: f64) -> Vec<f64> {
    let mut rates = Vec::new();
    let mut r = low;
    while r <= high + 1e-9 {
        rates.push(r);
        r += 2.0;
    }
    rates
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (2 min on 2 cores for the file): CI runs it with --include-ignored"]
async fn poisson_95() {
    let case = Case {
        rates: around(30.0, 42.0),
        ..BASELINE
    };
    prove("Poisson, 95 %", case).await;
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (2 min on 2 cores for the file): CI runs it with --include-ignored"]
async fn poisson_99() {
    let case = Case {
        objective: 99,
        rates: around(26.0, 40.0),
        ..BASELINE
    };
    prove("Poisson, 99 %", case).await;
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (2 min on 2 cores for the file): CI runs it with --include-ignored"]
async fn prefill_a_third_of_a_step() {
    let case = Case {
        prefill_per_token: Duration::from_micros(150),
        rates: around(14.0, 26.0),
        ..BASELINE
    };
    prove("prefill a third of a step at the knee", case).await;
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (2 min on 2 cores for the file): CI runs it with --include-ignored"]
async fn noisy_engine() {
    let case = Case {
        step_jitter: 0.5,
        rates: around(26.0, 40.0),
        // The truth is one draw of a noisy engine: over the engine's seeds 11 to 14 it was
        // 30.7, 31.1, 33.3 and 29.3 req/s, and the cold first phase's capacity −15, −2, +8
        // and +10 % from it.
        capacity_tolerance: 0.2,
        ..BASELINE
    };
    prove("noisy engine", case).await;
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (2 min on 2 cores for the file): CI runs it with --include-ignored"]
async fn two_models_share_the_engine() {
    let case = Case {
        models: &["llama", "qwen"],
        rates: around(30.0, 42.0),
        ..BASELINE
    };
    prove("two models", case).await;
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (2 min on 2 cores for the file): CI runs it with --include-ignored"]
async fn bursty_arrivals() {
    let case = Case {
        bursts: Some(Bursts {
            on: Duration::from_secs(2),
            off: Duration::from_secs(2),
        }),
        rates: around(14.0, 26.0),
        ..BASELINE
    };
    prove("on/off bursts", case).await;
}
