//! Saved sweeps read back, compared, and refused when they do not compare.

use super::*;
use crate::slo::spec::SloFile;

fn slos(yaml: &str) -> SloSet {
    SloSet::validate(None, None, None, serde_yaml::from_str::<SloFile>(yaml).unwrap()).unwrap()
}

const SLOS: &str =
    "slos:\n  - {name: tpot-30ms, objective: 90, tpot: 30ms}\n  - {name: ttft-1s, objective: 99, ttft: 1s}\n\
                    goodput: {require: [tpot-30ms]}\n";

fn q(base: f64) -> Quantiles {
    Quantiles {
        mean: base,
        p50: base,
        p90: base * 1.5,
        p99: base * 2.0,
    }
}

/// A step at `load` whose TPOT SLO saw `good` of 100 good.
fn step(load: Load, good: u64, slos: &SloSet) -> StepResult {
    StepResult {
        load,
        window_s: 30.0,
        requests: 100,
        errors: BTreeMap::from([("timeout", 2)]),
        error_examples: BTreeMap::from([("timeout", "took longer than 5m".to_string())]),
        ttft: q(0.1),
        ttfb: q(0.09),
        tpot: q(0.02),
        itl: q(0.02),
        e2e: q(2.0),
        prompt_tokens_mean: 256.0,
        output_tokens_mean: 128.0,
        ended_early: BTreeMap::from([("messages", (4, 25))]),
        requests_per_second: 3.2,
        output_tokens_per_second: 409.6,
        per_user_tokens_per_second: 50.0,
        goodput_requests_per_second: 3.0,
        goodput_output_tokens_per_second: 384.0,
        attainment: slos
            .slos
            .iter()
            .enumerate()
            .map(|(i, slo)| Attainment {
                slo: slo.name.to_string(),
                objective: slo.objective,
                valid: 98,
                good: if i == 0 { good } else { 98 },
                attainment: if i == 0 { good as f64 / 98.0 } else { 1.0 },
                required: slos.decides_goodput(i),
            })
            .collect(),
        client: Some(ClientHealth {
            wake_lag_p99_s: 0.0011,
            wake_lag_max_s: 0.004,
            send_lag_p99_s: 0.0009,
            client_cpu_cores: 0.25,
            host_busy: f64::NAN,
            host_steal: f64::NAN,
            cores: 2,
        }),
        lag_bound_s: crate::tools::sweep::health::lag_bound(slos),
    }
}

fn report(loads: &[(Load, u64)], workload: Option<&str>) -> Report {
    let slos = slos(SLOS);
    let mut steps: Vec<StepResult> = loads.iter().map(|&(load, good)| step(load, good, &slos)).collect();
    steps[0].ttfb = Quantiles::of(vec![]); // NaN, written as null
    Report {
        target: "http://a:8000".into(),
        model: "m".into(),
        endpoint: Endpoint::Responses,
        knee: Knee::from_steps(&steps, false),
        steps,
        slos,
        gpu_hour_price: Some(2.5),
        workload: workload.map(str::to_string),
        asked: Asked(
            json!({"endpoint": "responses", "output_tokens": 128, "loads": "rate 1,2,4"})
                .as_object()
                .unwrap()
                .clone(),
        ),
    }
}

fn write(name: &str, document: &Value) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("llmslo-saved-{}-{name}.json", std::process::id()));
    std::fs::write(&path, document.to_string()).unwrap();
    path
}

#[test]
fn a_saved_sweep_reads_back_as_the_report_it_was() {
    let original = report(
        &[(Load::Rate(1.0), 97), (Load::Rate(2.0), 90), (Load::Rate(4.0), 60)],
        Some("shape: 2 classes\n"),
    );
    let back = report_from_json(&original.to_json(), &slos(SLOS)).unwrap();
    assert_eq!(back.to_json(), original.to_json());
    assert_eq!(back.knee, original.knee);
    assert_eq!(back.knee.load, Some(Load::Rate(2.0)));
    assert!(back.steps[0].ttfb.p99.is_nan());
    assert_eq!(back.render(), original.render());
}

#[test]
fn the_lengths_asked_and_counted_and_the_apis_that_ended_early_are_told() {
    let mut report = report(&[(Load::Rate(1.0), 97), (Load::Rate(2.0), 90)], None);
    let text = report.render();
    assert!(text.contains("128 output tokens asked, 128.0 counted"), "{text}");
    assert!(
        text.contains(
            "output lengths: requests ended before the output tokens they asked (messages 8 of 50): the model \
             ended them first"
        ),
        "{text}"
    );
    report.asked.0.insert("ignore_eos".into(), json!(true));
    let text = report.render();
    assert!(
        text.contains("(messages 8 of 50): every request asked the engine to ignore its end-of-sequence token"),
        "{text}"
    );
}

#[test]
fn a_file_that_is_not_a_saved_sweep_is_refused_naming_the_field() {
    let slos = slos(SLOS);
    let good = report(&[(Load::Rate(1.0), 97), (Load::Rate(2.0), 90)], None).to_json();
    let edited = |edit: &dyn Fn(&mut Value)| {
        let mut document = good.clone();
        edit(&mut document);
        report_from_json(&document, &slos).unwrap_err()
    };
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|d| *d = json!([1, 2])), "expected an object"),
        (Box::new(|d| d["verdict"] = json!({})), "a comparison's result"),
        (
            Box::new(|d| {
                d["steps"][1]
                    .as_object_mut()
                    .unwrap()
                    .remove("tpot_p99_s")
                    .map(drop)
                    .unwrap()
            }),
            "`steps[1]`.tpot_p99_s: expected a number",
        ),
        (
            Box::new(|d| d["steps"][0]["errors"] = json!({"oops": 1})),
            "`oops` is not an outcome",
        ),
        (
            Box::new(|d| d["steps"][0]["ended_early"] = json!({"grpc": {"ended_early": 1, "served": 2}})),
            "ended_early.grpc: not an API",
        ),
        (
            Box::new(|d| d["steps"][0]["errors"] = json!({"timeout": 101})),
            "more failures than requests",
        ),
        (
            Box::new(|d| d["steps"][1]["concurrency"] = json!(4)),
            "expected one of them",
        ),
        (
            Box::new(|d| d["steps"][0]["attainment"]["tpot-30ms"] = json!(1.5)),
            "from 0 to 1",
        ),
        (Box::new(|d| d["steps"] = json!([])), "no step was measured"),
        (
            Box::new(|d| d["endpoint"] = json!("embeddings")),
            "`embeddings` is not one llmslo calls",
        ),
        (
            Box::new(|d| d["slos"][0]["objective"] = json!(0.95)),
            "judged against other SLOs",
        ),
        (
            Box::new(|d| d["slos"][1]["required"] = json!(true)),
            "judged against other SLOs",
        ),
        (Box::new(|d| d["knee"] = json!({})), "`knee.reached_max`"),
        (Box::new(|d| d["model"] = json!(3)), "`model`: expected text"),
    ];
    for (edit, expected) in cases {
        let error = edited(&*edit);
        assert!(error.contains(expected), "{error:?} should say {expected:?}");
    }
    let long = "x".repeat(10_000);
    let error = edited(&|d| d["endpoint"] = json!(long));
    assert!(
        error.len() < 400,
        "a string from the file is shown bounded: {} bytes",
        error.len()
    );
}

#[test]
fn two_saved_sweeps_compare_only_at_the_same_workload_and_kind_of_load() {
    let slos = slos(SLOS);
    let a = report(
        &[(Load::Rate(1.0), 97), (Load::Rate(2.0), 90), (Load::Rate(4.0), 60)],
        None,
    );
    let b = report(
        &[(Load::Rate(1.0), 97), (Load::Rate(2.0), 95), (Load::Rate(4.0), 80)],
        None,
    );
    let (path_a, path_b) = (write("a", &a.to_json()), write("b", &b.to_json()));
    let saved = SavedComparison::read(&path_a, &path_b, &slos).unwrap();
    let shown = saved.render();
    let (knee_a, knee_b) = (a.knee.crossing, b.knee.crossing);
    assert!(knee_a.is_finite() && knee_b > knee_a, "{knee_a} {knee_b}");
    assert!(
        shown.contains(&format!("knee: A {knee_a:.2} req/s, B {knee_b:.2} req/s")),
        "{shown}"
    );
    assert!(shown.contains("no verdict"), "{shown}");
    let document = saved.to_json();
    let difference = document["knee"]["difference"].as_f64().unwrap();
    assert!((difference - (knee_b - knee_a)).abs() < 1e-9, "{difference}");
    assert_eq!(document["verdict"], Value::Null);

    let other = report(&[(Load::Rate(1.0), 97)], Some("replay of t.jsonl\n"));
    let path_other = write("other", &other.to_json());
    let error = SavedComparison::read(&path_a, &path_other, &slos)
        .unwrap_err()
        .to_string();
    assert!(error.contains("different workloads"), "{error}");
    let closed = report(&[(Load::Concurrency(4), 97)], None);
    let path_closed = write("closed", &closed.to_json());
    let error = SavedComparison::read(&path_a, &path_closed, &slos)
        .unwrap_err()
        .to_string();
    assert!(error.contains("do not compare"), "{error}");
    let error = SavedComparison::read(&path_a, Path::new("/nonexistent/b.json"), &slos)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("/nonexistent/b.json: "), "{error}");
    std::fs::write(&path_other, "{not json").unwrap();
    let error = SavedComparison::read(&path_a, &path_other, &slos)
        .unwrap_err()
        .to_string();
    assert!(error.contains("not the JSON `llmslo sweep --json` writes"), "{error}");
    for path in [path_a, path_b, path_other, path_closed] {
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn a_knee_never_reached_is_not_reached_in_the_saved_comparison() {
    let slos = slos(SLOS);
    let a = report(
        &[(Load::Rate(1.0), 97), (Load::Rate(2.0), 90), (Load::Rate(4.0), 60)],
        None,
    );
    // B held at every load: its knee lies above 4 req/s, unmeasured.
    let b = report(
        &[(Load::Rate(1.0), 98), (Load::Rate(2.0), 98), (Load::Rate(4.0), 97)],
        None,
    );
    assert!(!b.knee.reached() && b.knee.crossing.is_nan());
    let shown_b = b.render();
    assert!(
        shown_b.contains("knee not reached: the SLOs held up to 4 req/s") && !shown_b.contains("◀ knee"),
        "{shown_b}"
    );
    assert_eq!(b.to_json()["knee"]["reached"], false);
    assert_eq!(b.to_json()["knee"]["held_up_to"]["rate"], 4.0);
    let (path_a, path_b) = (write("reached-a", &a.to_json()), write("unreached-b", &b.to_json()));
    let saved = SavedComparison::read(&path_a, &path_b, &slos).unwrap();
    let shown = saved.render();
    assert!(shown.contains("B not reached") && !shown.contains("B − A"), "{shown}");
    let document = saved.to_json();
    assert_eq!(document["knee"]["b"], Value::Null);
    assert_eq!(document["knee"]["difference"], Value::Null);
    let svg = crate::tools::sweep::plot::render_comparison(&saved.a, &saved.b).unwrap();
    assert!(svg.contains("(knee not reached)"), "the plot says so too");
    for path in [path_a, path_b] {
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn saved_results_that_asked_for_other_requests_are_refused_naming_the_field() {
    let slos = slos(SLOS);
    let a = report(&[(Load::Rate(1.0), 97), (Load::Rate(2.0), 90)], None);
    let path_a = write("asked-a", &a.to_json());
    for (field, value, said) in [
        (
            "output_tokens",
            json!(64),
            "`output_tokens` is `128` in A and `64` in B",
        ),
        (
            "loads",
            json!("rate 1,4"),
            "`loads` is `rate 1,2,4` in A and `rate 1,4` in B",
        ),
        (
            "endpoint",
            json!("chat"),
            "`endpoint` is `responses` in A and `chat` in B",
        ),
    ] {
        let mut b = a.to_json();
        b["asked"][field] = value;
        let path_b = write("asked-b", &b);
        let error = SavedComparison::read(&path_a, &path_b, &slos).unwrap_err().to_string();
        assert!(error.contains(said) && error.contains("do not compare"), "{error}");
    }
    let mut old = a.to_json();
    old.as_object_mut().unwrap().remove("asked");
    let path_old = write("asked-old", &old);
    let error = SavedComparison::read(&path_a, &path_old, &slos)
        .unwrap_err()
        .to_string();
    assert!(error.contains("`asked`: missing"), "{error}");
    for path in [path_a, path_old, write("asked-b", &json!({}))] {
        std::fs::remove_file(path).unwrap();
    }
}

/// `step` judged by fewer requests: `valid` of them, `good` good.
fn few(load: Load, valid: u64, good: u64, slos: &SloSet) -> StepResult {
    let mut step = step(load, good, slos);
    step.attainment[0].valid = valid;
    step.attainment[0].attainment = good as f64 / valid as f64;
    step
}

#[test]
fn a_replay_says_one_thing_of_held_crossed_and_the_knee() {
    let slos = slos(SLOS);
    let asked = |workload: &str| Asked(json!({ "workload": workload }).as_object().unwrap().clone());
    // 2 req/s: 26 of 30 good, 86.7 % under the 90 % objective, too few to judge; 4 req/s missed.
    let steps = vec![
        step(Load::Rate(1.0), 98, &slos),
        few(Load::Rate(2.0), 30, 26, &slos),
        step(Load::Rate(4.0), 60, &slos),
    ];
    let knee = Knee::from_steps(&steps, false);
    assert_eq!(
        (knee.reached_load(), knee.first_missed),
        (Some(Load::Rate(2.0)), Some(Load::Rate(4.0)))
    );
    assert!(
        knee.crossing.is_nan(),
        "no crossing above a knee already under its objective"
    );
    let line = knee.describe(asked("replay of t.jsonl (30 requests)").more_requests());
    assert!(
        line.starts_with("knee: 2 req/s")
            && line.contains("`tpot-30ms` had 30 of the 50 requests it needs, and stood at 86.7 % under its 90.0 % objective (replay a longer trace)")
            && !line.contains("held")
            && !line.contains("--duration"),
        "{line}"
    );
    // Without the miss above it, nothing is said to have held, and no knee is named.
    let knee = Knee::from_steps(&steps[..2], false);
    let line = knee.describe("replay a longer trace");
    assert!(
        line.starts_with("knee not reached: no load missed the SLOs up to 2 req/s") && !line.contains("held"),
        "{line}"
    );
    // A crossing lies between the knee and the first miss, never below the knee.
    let steps = vec![
        step(Load::Rate(1.0), 98, &slos),
        step(Load::Rate(2.0), 95, &slos),
        step(Load::Rate(4.0), 60, &slos),
    ];
    let knee = Knee::from_steps(&steps, false);
    assert!((2.0..4.0).contains(&knee.crossing), "{}", knee.crossing);
}
