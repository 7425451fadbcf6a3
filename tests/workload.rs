//! Workload-shaped sweeps on the batching simulator (prefill cost, two prompt-length classes,
//! bursty arrivals), under paused time: a trace replayed through the sidecar comes back from
//! its `/workload` as it was sent; the shape read from there reproduces the lengths and finds
//! the knee that replaying the trace finds; a fixed-length workload finds another.

use crate::common;

use crate::common::{start_engine, start_sidecar};
use clap::Parser;
use llmslo::tools::simulate::batching::BatchingOptions;
use llmslo::tools::simulate::SimOptions;
use llmslo::tools::sweep::args::SweepArgs;
use llmslo::tools::sweep::client::fetch_text;
use llmslo::tools::sweep::report::Report;
use llmslo::tools::sweep::stats::Load;
use llmslo::workload::shape::Shape;
use llmslo::workload::trace::{Trace, TraceRow};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Gamma};
use std::path::PathBuf;
use std::time::Duration;

/// TPOT within 30 ms and TTFT within 2 s, for 95 % of requests.
const SLOS: &str = "slos:\n  - name: tpot-30ms\n    objective: 95\n    tpot: 30ms\n  - name: ttft-2s\n    objective: 95\n    ttft: 2s\n";

/// `llmslo sweep`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct Sweep {
    #[command(flatten)]
    args: SweepArgs,
}

/// Decode steps of 10 ms + 0.5 ms a running request, and prefill at 20 µs a prompt token:
/// a 2000-token prompt stalls everyone's next token by 40 ms.
fn engine() -> SimOptions {
    SimOptions {
        batching: Some(BatchingOptions {
            step_base: Duration::from_millis(10),
            step_per_seq: Duration::from_micros(500),
            prefill_per_token: Duration::from_micros(20),
            max_batch: 256,
            kv_tokens: None,
            step_jitter: 0.0,
        }),
        ..SimOptions::default()
    }
}

/// 1200 requests over about two minutes, arriving in bursts (gamma gaps of shape 0.5): 70 % chat
/// with short prompts and answers up to 60 tokens, 30 % completions with 1500–2500-token
/// prompts and short answers.
fn original_trace() -> Trace {
    let mut rng = SmallRng::seed_from_u64(11);
    let gaps = Gamma::new(0.5, 1000.0 / (10.0 * 0.5)).unwrap();
    let mut at = 0.0;
    let rows = (0..1200)
        .map(|_| {
            at += gaps.sample(&mut rng);
            let long = rng.random_bool(0.3);
            let (api, input, output) = if long {
                ("completions", rng.random_range(1500..=2500), rng.random_range(10..=30))
            } else {
                ("chat", rng.random_range(50..=150), rng.random_range(20..=60))
            };
            TraceRow {
                timestamp: at as u64,
                api: Some(api.into()),
                ..TraceRow::lengths(input, output)
            }
        })
        .collect();
    Trace::new(rows)
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("llmslo-workload-{}-{name}", std::process::id()))
}

/// Runs `llmslo sweep` with these flags (and the SLO file) in this runtime.
async fn sweep(flags: &[&str]) -> Report {
    let config = temp("slos.yaml");
    std::fs::write(&config, SLOS).unwrap();
    let mut argv = vec!["sweep", "--config", config.to_str().unwrap(), "--model", "sim"];
    argv.extend_from_slice(flags);
    let options = Sweep::try_parse_from(argv).unwrap().args.options().await.unwrap();
    llmslo::tools::sweep::run(options).await.unwrap()
}

/// Where the knee's objective is crossed, between the highest rate that met the SLOs and
/// the lowest that missed them.
fn knee_rate(report: &Report) -> f64 {
    let (Some(Load::Rate(met)), Some(Load::Rate(missed))) = (report.knee.load, report.knee.first_missed) else {
        panic!("no rate knee:\n{}", report.render());
    };
    let crossing = report.knee.crossing;
    assert!((met..=missed).contains(&crossing), "{crossing} outside {met}..{missed}");
    crossing
}

/// Nearest-rank quantile of `values`.
fn quantile(values: &[u32], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (q * sorted.len() as f64).ceil() as usize;
    f64::from(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn lengths<'a>(rows: impl Iterator<Item = &'a TraceRow>, api: &str, input: bool) -> Vec<u32> {
    rows.filter(|r| r.api.as_deref() == Some(api))
        .map(|r| if input { r.input_length } else { r.output_length })
        .collect()
}

#[tokio::test(start_paused = true)]
#[ignore = "long proof (a minute on 2 cores): CI runs it with --include-ignored"]
async fn the_recorded_workload_reproduces_the_trace_and_its_knee() {
    let original = original_trace();
    let trace_file = temp("original.jsonl");
    std::fs::write(&trace_file, original.to_jsonl()).unwrap();
    let (engine, stop) = start_engine(engine()).await;
    let sidecar = start_sidecar(engine, "workload: {recent_requests: 5000}\n").await;

    // 1. The trace, replayed through the sidecar at its own timing, comes back from /workload.
    let target = format!("http://{}", sidecar.proxy_addr);
    let replayed = sweep(&[
        "--target",
        &target,
        "--replay",
        trace_file.to_str().unwrap(),
        "--rate-scale",
        "1",
    ])
    .await;
    assert_eq!(replayed.steps.len(), 1);
    assert_eq!(replayed.steps[0].requests, 1200);
    assert_eq!(replayed.steps[0].failed(), 0);
    let url = format!("http://{}/workload", sidecar.metrics_addr);
    let mut exported = Trace::parse("workload", &fetch_text(&url, None).await.unwrap()).unwrap();
    // Before the replay the sweep measured the target's tokens a word (two prompts on each API)
    // and checked it with one request: the sidecar saw those five too.
    assert_eq!(exported.rows.len(), original.rows.len() + 5);
    exported = Trace::new(exported.rows.split_off(5));
    let mut errors: Vec<u64> = exported
        .rows
        .iter()
        .zip(&original.rows)
        .map(|(e, o)| e.timestamp.abs_diff(o.timestamp))
        .collect();
    errors.sort_unstable();
    assert!(
        errors[errors.len() * 99 / 100] <= 1,
        "offsets off by {:?} ms at the top",
        &errors[1180..]
    );
    let key = |r: &TraceRow| (r.api.clone(), r.input_length, r.output_length);
    let mut sent: Vec<_> = original.rows.iter().map(key).collect();
    let mut seen: Vec<_> = exported.rows.iter().map(key).collect();
    sent.sort();
    seen.sort();
    assert_eq!(seen, sent, "every request's API and lengths, exactly");
    assert!(exported
        .rows
        .iter()
        .all(|r| r.model.as_deref() == Some("sim") && r.stream == Some(true)));

    // 2. --workload-from reads the shape there (and saves it); its lengths are the trace's.
    let shape_file = temp("shape.yaml");
    let metrics_port = format!("http://{}", sidecar.metrics_addr);
    let from_sidecar = sweep(&[
        "--target",
        &format!("http://{engine}"),
        "--workload-from",
        &metrics_port,
        "--workload",
        shape_file.to_str().unwrap(),
        "--warmup",
        "5s",
        "--duration",
        "120s",
    ])
    .await;
    let shape = Shape::from_yaml("saved", &std::fs::read_to_string(&shape_file).unwrap()).unwrap();
    assert_eq!(shape.requests, 1205, "the replay, and the five requests before it");
    assert!((shape.burstiness - 0.5).abs() < 0.15, "burstiness {}", shape.burstiness);
    assert_eq!(shape.classes.len(), 2);
    let drawn = shape.draw(20_000, 5);
    for api in ["chat", "completions"] {
        for input in [true, false] {
            let want = lengths(original.rows.iter(), api, input);
            let got = lengths(drawn.iter(), api, input);
            for q in [0.1, 0.5, 0.9, 0.99] {
                let (w, g) = (quantile(&want, q), quantile(&got, q));
                assert!(
                    (g - w).abs() <= 0.1 * w,
                    "{api} input={input} q{q}: drawn {g}, trace {w}"
                );
            }
        }
    }
    let report = from_sidecar.workload.as_deref().unwrap();
    assert!(
        report.contains("burstiness") && report.contains("completions"),
        "{report}"
    );

    // 3. Its knee is the replayed trace's, within 10 %; a fixed-length workload's is not.
    let replay_knee = knee_rate(
        &sweep(&[
            "--target",
            &format!("http://{engine}"),
            "--replay",
            trace_file.to_str().unwrap(),
        ])
        .await,
    );
    let shape_knee = knee_rate(&from_sidecar);
    let mean = |f: fn(&TraceRow) -> u32| {
        (original.rows.iter().map(|r| f64::from(f(r))).sum::<f64>() / 1200.0)
            .round()
            .to_string()
    };
    let fixed = sweep(&[
        "--target",
        &format!("http://{engine}"),
        "--prompt-tokens",
        &mean(|r| r.input_length),
        "--output-tokens",
        &mean(|r| r.output_length),
        "--rate",
        "auto",
        "--warmup",
        "5s",
        "--duration",
        "120s",
    ])
    .await;
    let fixed_knee = knee_rate(&fixed);
    eprintln!("knees: replay {replay_knee:.2}, shape {shape_knee:.2}, fixed lengths {fixed_knee:.2} req/s");
    assert!(
        (shape_knee - replay_knee).abs() <= 0.1 * replay_knee,
        "shape {shape_knee} against replay {replay_knee}"
    );
    assert!(
        (fixed_knee - replay_knee).abs() > 0.15 * replay_knee,
        "fixed {fixed_knee} against replay {replay_knee}"
    );
    sidecar.shutdown().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_traces_shapes_and_comparisons_get_a_clear_error_and_nothing_runs() {
    let config = temp("bad-slos.yaml");
    std::fs::write(&config, SLOS).unwrap();
    let one_row = temp("one.jsonl");
    std::fs::write(
        &one_row,
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 5}\n",
    )
    .unwrap();
    let trace = temp("two.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 5}\n{\"timestamp\": 500, \"input_length\": 5, \"output_length\": 5}\n",
    )
    .unwrap();
    let bad_shape = temp("bad-shape.yaml");
    std::fs::write(&bad_shape, "rate: 1\n").unwrap();
    let (engine, stop) = start_engine(engine()).await;
    let sidecar = start_sidecar(engine, "").await;
    let target = format!("http://{engine}");
    let path = |p: &PathBuf| p.to_str().unwrap().to_string();
    let run = |extra: Vec<String>| {
        let mut all: Vec<String> = ["sweep", "--config", config.to_str().unwrap(), "--model", "sim"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        all.extend(extra);
        common::llmslo_output_async(all)
    };
    let cases: Vec<(Vec<String>, i32, String)> = vec![
        (
            vec![
                "--target".into(),
                target.clone(),
                "--replay".into(),
                "/nonexistent.jsonl".into(),
            ],
            64,
            "--replay /nonexistent.jsonl: No such file".into(),
        ),
        (
            vec!["--target".into(), target.clone(), "--replay".into(), path(&one_row)],
            64,
            "a trace needs two requests at different times".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--replay".into(),
                path(&trace),
                "--rate-scale".into(),
                "0".into(),
            ],
            64,
            "--rate-scale 0: expected `auto`, or multiples of the trace's own rate above zero".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--replay".into(),
                path(&trace),
                "--dataset".into(),
                "x.jsonl".into(),
            ],
            2,
            "cannot be used with".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--replay".into(),
                path(&trace),
                "--rate".into(),
                "2".into(),
            ],
            2,
            "cannot be used with".into(),
        ),
        (
            vec!["--target".into(), target.clone(), "--rate-scale".into(), "2".into()],
            2,
            "--replay".into(),
        ),
        // Flags with nothing to shape in the mode are refused with the reason, not ignored.
        (
            vec![
                "--target".into(),
                target.clone(),
                "--replay".into(),
                path(&trace),
                "--duration".into(),
                "60s".into(),
            ],
            64,
            "--duration does not apply with --replay: each step replays the whole trace".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--replay".into(),
                path(&trace),
                "--output-tokens".into(),
                "64".into(),
            ],
            64,
            "--output-tokens does not apply with --replay".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--rate".into(),
                "2".into(),
                "--max-concurrency".into(),
                "8".into(),
            ],
            64,
            "--max-concurrency bounds a concurrency search; these steps are rates".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--concurrency".into(),
                "2".into(),
                "--exact-arrivals".into(),
            ],
            64,
            "--exact-arrivals shapes open-loop arrivals: give --rate".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--workload-from".into(),
                "ftp://sidecar".into(),
            ],
            64,
            "expected a sidecar's metrics port".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--workload-from".into(),
                format!("http://{}", sidecar.metrics_addr),
            ],
            1,
            "no workload is kept: set workload.recent_requests".into(),
        ),
        (
            vec!["--target".into(), target.clone(), "--workload".into(), path(&bad_shape)],
            64,
            "not a workload shape".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--rate".into(),
                "1".into(),
                "--burstiness".into(),
                "0".into(),
            ],
            64,
            "--burstiness 0: a gamma shape above zero".into(),
        ),
        (
            vec![
                "--target".into(),
                target.clone(),
                "--concurrency".into(),
                "4".into(),
                "--burstiness".into(),
                "0.5".into(),
            ],
            64,
            "--burstiness shapes open-loop arrivals: give --rate".into(),
        ),
        (
            vec!["--target".into(), target.clone(), "--max-rate".into(), "0".into()],
            64,
            "--max-rate 0: a rate above zero".into(),
        ),
        (vec!["--compare".into(), target.clone()], 2, "2 values required".into()),
        (
            vec![
                "--compare".into(),
                target.clone(),
                target.clone(),
                "--target".into(),
                target.clone(),
            ],
            2,
            "cannot be used with".into(),
        ),
        (
            vec!["--compare".into(), target.clone(), target.clone()],
            64,
            "--compare measures both targets at the same loads".into(),
        ),
        (
            vec!["--target".into(), target.clone(), "--repetitions".into(), "3".into()],
            64,
            "--repetitions counts the runs of a comparison".into(),
        ),
    ];
    for (flags, code, says) in cases {
        let (got, stdout, stderr) = run(flags.clone()).await;
        assert_eq!(got, code, "{flags:?}: {stderr}");
        assert!(stderr.contains(&says), "{flags:?}: `{says}` not in {stderr}");
        assert!(stdout.is_empty(), "{flags:?}: no table");
    }
    sidecar.shutdown().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_port_serves_the_recent_requests_without_their_words() {
    let (engine, stop) = start_engine(common::timed_engine(2, 1)).await;
    let sidecar = start_sidecar(engine, "workload: {recent_requests: 2}\n").await;
    for max_tokens in [3, 4, 5] {
        let body = common::chat_body(max_tokens, true, true).replace("hello there", "a secret prompt");
        common::post_collect(sidecar.proxy_addr, "/v1/chat/completions", body).await;
    }
    common::settle(&sidecar).await;
    let url = format!("http://{}/workload", sidecar.metrics_addr);
    let page = fetch_text(&url, None).await.unwrap();
    let trace = Trace::parse("workload", &page).unwrap();
    let outputs: Vec<u32> = trace.rows.iter().map(|r| r.output_length).collect();
    assert_eq!(outputs, [4, 5], "the last two, oldest first");
    assert!(trace
        .rows
        .iter()
        .all(|r| r.api.as_deref() == Some("chat") && r.input_length > 0));
    assert!(!page.contains("secret") && !page.contains("hello"), "{page}");
    sidecar.shutdown().await;
    stop.cancel();
}
