//! The live SLO evaluation's tests.

use super::*;
use crate::record::{Operation, Outcome};
use spec::SloFile;
use std::time::Duration;

const MIN: Duration = Duration::from_secs(60);

fn engine() -> Arc<SloEngine> {
    let file: SloFile = serde_yaml::from_str(
        "slos:\n  - {name: ttft, objective: 99, ttft: 500ms}\n  - {name: tpot, objective: 99, tpot: 50ms}\n  \
         - {name: avail, objective: 99.9, availability: true}\ngoodput: {require: [ttft, tpot]}\n",
    )
    .unwrap();
    let set = SloSet::validate(Some("chat".into()), None, Some(20), file).unwrap();
    SloEngine::new(set, &mut Registry::default())
}

fn request(outcome: Outcome, ttft_ms: u64, tpot_ms: u64) -> RequestRecord {
    RequestRecord {
        outcome,
        ttft: Some(Duration::from_millis(ttft_ms)),
        answer_ttft: Some(Duration::from_millis(ttft_ms)),
        tpot_per_choice: vec![Duration::from_millis(tpot_ms)],
        output_tokens: Some(10),
        input_tokens: Some(5),
        token_events: 10,
        ..RequestRecord::new("m".into(), Operation::Chat, Duration::from_secs(1))
    }
}

fn send(engine: &SloEngine, n: usize, record: &RequestRecord) {
    for _ in 0..n {
        engine.record(record, || None);
    }
}

fn ratio(s: &Snapshot, slo: &str, window: &str) -> f64 {
    s.error_ratio
        .iter()
        .find(|(l, w, _)| l.slo == slo && *w == window)
        .unwrap()
        .2
}

fn burn(s: &Snapshot, slo: &str, window: &str) -> f64 {
    s.burn_rate
        .iter()
        .find(|(l, w, _)| l.slo == slo && *w == window)
        .unwrap()
        .2
}

fn budget(s: &Snapshot, slo: &str) -> f64 {
    s.budget_remaining.iter().find(|(l, _)| l.slo == slo).unwrap().1
}

fn per_model(values: &[(ServiceModelLabels, &'static str, f64)], window: &str) -> f64 {
    values.iter().find(|(_, w, _)| *w == window).unwrap().2
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn a_ttft_slo_judges_long_prompts_by_their_allowance_or_not_at_all() {
    let file: SloFile = serde_yaml::from_str(
        "slos:\n  - {name: short, objective: 99, ttft: 500ms, max_prompt_tokens: 4096}\n  \
         - {name: scaled, objective: 99, ttft: 500ms, per_1k_prompt_tokens: 100ms}\n",
    )
    .unwrap();
    let set = SloSet::validate(None, None, None, file).unwrap();
    let [short, scaled] = [&set.slos[0], &set.slos[1]];
    let prompt = |tokens: Option<u64>, ttft_ms: u64| {
        let mut r = request(Outcome::Success, ttft_ms, 10);
        r.input_tokens = tokens;
        r
    };
    assert_eq!(classify(short, &prompt(Some(8000), 1400)), Verdict::NotCounted);
    assert_eq!(classify(short, &prompt(Some(4096), 600)), Verdict::Bad);
    assert_eq!(classify(short, &prompt(None, 600)), Verdict::Bad, "unknown: judged");
    assert_eq!(
        classify(scaled, &prompt(Some(8000), 1300)),
        Verdict::Good,
        "500 + 8 x 100 ms"
    );
    assert_eq!(classify(scaled, &prompt(Some(8000), 1301)), Verdict::Bad);
    assert_eq!(classify(scaled, &prompt(None, 501)), Verdict::Bad);
}

#[test]
fn classification_follows_the_design() {
    let set = engine().set();
    let [ttft, tpot, avail] = [&set.slos[0], &set.slos[1], &set.slos[2]];
    assert_eq!(
        classify(ttft, &request(Outcome::Success, 500, 10)),
        Verdict::Good,
        "the threshold is inclusive"
    );
    assert_eq!(classify(ttft, &request(Outcome::Success, 501, 10)), Verdict::Bad);
    assert_eq!(classify(tpot, &request(Outcome::Success, 1, 51)), Verdict::Bad);
    assert_eq!(
        classify(ttft, &request(Outcome::UpstreamError, 900, 10)),
        Verdict::NotCounted
    );
    assert_eq!(classify(avail, &request(Outcome::UpstreamError, 1, 1)), Verdict::Bad);
    assert_eq!(classify(avail, &request(Outcome::Timeout, 1, 1)), Verdict::Bad);
    assert_eq!(
        classify(avail, &request(Outcome::ClientCancelled, 1, 1)),
        Verdict::NotCounted
    );
    assert_eq!(
        classify(avail, &request(Outcome::ClientError, 1, 1)),
        Verdict::NotCounted
    );
    let mut whole = request(Outcome::Success, 0, 0);
    whole.ttft = None;
    whole.tpot_per_choice.clear();
    assert_eq!(
        classify(ttft, &whole),
        Verdict::NotCounted,
        "non-streaming: no TTFT to judge"
    );
    assert_eq!(classify(avail, &whole), Verdict::Good);
}

#[tokio::test(start_paused = true)]
async fn zero_traffic() {
    let engine = engine();
    engine.create_series(&"m".into());
    tokio::time::advance(10 * MIN).await;
    let s = engine.snapshot(Instant::now());
    assert!(ratio(&s, "avail", "5m").is_nan() && burn(&s, "avail", "1h").is_nan());
    assert_eq!(budget(&s, "avail"), 1.0);
    assert_eq!(per_model(&s.goodput_rps, "5m"), 0.0);
    assert!(per_model(&s.attainment, "5m").is_nan());
}

#[tokio::test(start_paused = true)]
async fn below_min_events_ratios_are_nan() {
    let engine = engine();
    send(&engine, 19, &request(Outcome::UpstreamError, 1, 1));
    let s = engine.snapshot(Instant::now());
    assert!(ratio(&s, "avail", "5m").is_nan());
    assert!(burn(&s, "avail", "3d").is_nan());
    assert!(budget(&s, "avail") < 0.0, "the budget still counts every event");
    engine.record(&request(Outcome::UpstreamError, 1, 1), || None);
    assert_eq!(ratio(&engine.snapshot(Instant::now()), "avail", "5m"), 1.0);
}

#[tokio::test(start_paused = true)]
async fn a_known_pattern_through_the_windows() {
    let engine = engine();
    // Minute 0: 95 good and 5 engine errors.
    send(&engine, 95, &request(Outcome::Success, 100, 10));
    send(&engine, 5, &request(Outcome::UpstreamError, 1, 1));
    let s = engine.snapshot(Instant::now());
    assert!(close(ratio(&s, "avail", "5m"), 0.05));
    assert!(close(burn(&s, "avail", "5m"), 50.0), "0.05 / 0.001");
    assert!(close(budget(&s, "avail"), 1.0 - 50.0));
    assert_eq!(
        ratio(&s, "ttft", "5m"),
        0.0,
        "95 fast successes; the errors are not TTFT events"
    );

    // Minute 10: 100 good more. The 5m window holds only them; 30m holds everything.
    tokio::time::advance(10 * MIN).await;
    send(&engine, 100, &request(Outcome::Success, 100, 10));
    let s = engine.snapshot(Instant::now());
    assert!(close(ratio(&s, "avail", "5m"), 0.0));
    assert!(close(ratio(&s, "avail", "30m"), 5.0 / 200.0));
    assert!(close(burn(&s, "avail", "1h"), 25.0));
    assert!(close(budget(&s, "avail"), 1.0 - 25.0));
    // Goodput: 195 good of 200 valid; per second of min(uptime, window).
    assert!(close(per_model(&s.attainment, "1h"), 195.0 / 200.0));
    assert!(
        close(per_model(&s.goodput_rps, "1h"), 195.0 / 600.0),
        "uptime 10 min < 1h"
    );
    assert!(close(per_model(&s.goodput_rps, "5m"), 100.0 / 300.0));
    assert!(close(per_model(&s.goodput_tps, "1h"), 1950.0 / 600.0));
    let coverage: BTreeMap<_, _> = s.coverage.iter().copied().collect();
    assert!(close(coverage["5m"], 1.0) && close(coverage["30m"], 1.0 / 3.0) && close(coverage["1h"], 1.0 / 6.0));

    // Four days later: every alerting window is empty; the 30-day period still counts.
    tokio::time::advance(Duration::from_secs(4 * 86_400)).await;
    let s = engine.snapshot(Instant::now());
    assert!(ratio(&s, "avail", "3d").is_nan());
    assert!(close(budget(&s, "avail"), 1.0 - 25.0));
}

#[tokio::test(start_paused = true)]
async fn an_all_bad_burst_and_goodput_misses() {
    let engine = engine();
    send(&engine, 30, &request(Outcome::Success, 900, 10)); // slow first token
    send(&engine, 30, &request(Outcome::Success, 100, 80)); // slow decode
    send(&engine, 40, &request(Outcome::Success, 100, 10));
    send(&engine, 10, &request(Outcome::ClientCancelled, 100, 10));
    let s = engine.snapshot(Instant::now());
    assert!(close(ratio(&s, "ttft", "5m"), 30.0 / 100.0));
    assert!(close(ratio(&s, "tpot", "5m"), 30.0 / 100.0));
    assert!(close(burn(&s, "ttft", "5m"), 30.0));
    assert!(
        close(per_model(&s.attainment, "5m"), 40.0 / 100.0),
        "cancelled requests are not valid"
    );
    let text = {
        let mut registry = Registry::default();
        let e = SloEngine::new(engine.set().as_ref().clone(), &mut registry);
        send(&e, 3, &request(Outcome::Success, 100, 10));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    };
    assert!(text.contains("llmslo_goodput_requests_total{slo_service=\"chat\",model=\"m\"} 3"));
    assert!(text.contains("llmslo_goodput_judged_requests_total{slo_service=\"chat\",model=\"m\"} 3"));
    assert!(text.contains("llmslo_goodput_output_tokens_total{slo_service=\"chat\",model=\"m\"} 30"));
    assert!(text.contains("llmslo_slo_events_total{slo_service=\"chat\",slo=\"ttft\",model=\"m\"} 3"));
    assert!(text.contains("llmslo_slo_error_ratio{slo_service=\"chat\",slo=\"avail\",model=\"m\",window=\"5m\"} NaN"));
    assert!(text.contains("llmslo_slo_attainment_ratio{slo_service=\"chat\",model=\"m\",window=\"5m\"} 1.0"));
    assert!(text.contains("llmslo_slo_window_coverage_ratio{window=\"3d\"} 0.0"));
}

#[tokio::test(start_paused = true)]
async fn without_goodput_require_every_slo_decides_goodput() {
    let file: SloFile = serde_yaml::from_str(
        "slos:\n  - {name: ttft, objective: 99, ttft: 500ms}\n  - {name: tpot, objective: 99, tpot: 50ms}\n",
    )
    .unwrap();
    let set = SloSet::validate(Some("chat".into()), None, Some(1), file).unwrap();
    let engine = SloEngine::new(set, &mut Registry::default());
    send(&engine, 3, &request(Outcome::Success, 100, 10));
    send(&engine, 1, &request(Outcome::Success, 900, 10)); // slow first token
    send(&engine, 1, &request(Outcome::Success, 100, 80)); // slow decode
    let s = engine.snapshot(Instant::now());
    assert!(close(per_model(&s.attainment, "5m"), 3.0 / 5.0), "not 'every success'");
}

#[tokio::test(start_paused = true)]
async fn without_slos_nothing_is_judged_and_goodput_reads_nan() {
    let set = SloSet::validate(Some("chat".into()), None, Some(1), SloFile::default()).unwrap();
    let mut registry = Registry::default();
    let engine = SloEngine::new(set, &mut registry);
    engine.create_series(&"m".into());
    send(&engine, 5, &request(Outcome::Success, 100, 10));
    tokio::time::advance(MIN).await;
    let s = engine.snapshot(Instant::now());
    for values in [&s.goodput_rps, &s.goodput_tps, &s.attainment] {
        assert!(per_model(values, "5m").is_nan(), "nothing judged, not 100 %");
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        !text.contains("llmslo_goodput_requests_total{"),
        "no goodput counted: {text}"
    );
    assert!(!text.contains("llmslo_goodput_judged_requests_total{"));
    assert!(text.contains("llmslo_slo_attainment_ratio{slo_service=\"chat\",model=\"m\",window=\"5m\"} NaN"));
}

#[tokio::test(start_paused = true)]
async fn a_reload_that_renames_the_service_starts_its_windows_afresh() {
    let engine = engine();
    send(&engine, 30, &request(Outcome::UpstreamError, 1, 1));
    let mut renamed = engine.set().as_ref().clone();
    renamed.service = "search".into();
    engine.reload(renamed);
    engine.record(&request(Outcome::Success, 100, 10), || None);
    let s = engine.snapshot(Instant::now());
    assert!(s.error_ratio.iter().all(|(l, _, _)| l.slo_service == "search"));
    assert!(
        ratio(&s, "avail", "5m").is_nan(),
        "one event of the new service, below min_events"
    );
}

#[tokio::test(start_paused = true)]
async fn pooling_work_counts_for_availability_but_not_for_goodput() {
    let engine = engine();
    send(&engine, 30, &request(Outcome::Success, 100, 10));
    let mut embedding = request(Outcome::Success, 0, 0);
    embedding.operation = Operation::Embeddings;
    (embedding.ttft, embedding.answer_ttft, embedding.output_tokens) = (None, None, None);
    embedding.tpot_per_choice.clear();
    send(&engine, 10, &embedding);
    send(
        &engine,
        10,
        &RequestRecord {
            outcome: Outcome::UpstreamError,
            ..embedding.clone()
        },
    );
    let s = engine.snapshot(Instant::now());
    assert!(
        close(ratio(&s, "avail", "5m"), 10.0 / 50.0),
        "every route answers to availability"
    );
    assert!(
        close(ratio(&s, "ttft", "5m"), 0.0),
        "only streamed generation has a TTFT"
    );
    assert!(close(per_model(&s.attainment, "5m"), 1.0), "goodput is generation's");
}

#[tokio::test(start_paused = true)]
async fn answer_ttft_judges_the_first_answer_token() {
    let file: SloFile = serde_yaml::from_str("slos:\n  - {name: answer, objective: 99, answer_ttft: 2s}\n").unwrap();
    let set = SloSet::validate(None, None, Some(1), file).unwrap();
    let slo = &set.slos[0];
    let mut reasoned = request(Outcome::Success, 300, 10);
    reasoned.answer_ttft = Some(Duration::from_millis(2500));
    assert_eq!(
        classify(slo, &reasoned),
        Verdict::Bad,
        "a long reasoning before the answer"
    );
    reasoned.answer_ttft = Some(Duration::from_secs(2));
    assert_eq!(classify(slo, &reasoned), Verdict::Good);
    reasoned.answer_ttft = None;
    assert_eq!(
        classify(slo, &reasoned),
        Verdict::NotCounted,
        "a tool call alone has no answer token"
    );
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_the_history_of_slos_that_stay() {
    let engine = engine();
    send(&engine, 50, &request(Outcome::UpstreamError, 1, 1));
    let file: SloFile = serde_yaml::from_str("slos:\n  - {name: avail, objective: 99, availability: true}\n").unwrap();
    engine.reload(SloSet::validate(Some("chat".into()), None, Some(20), file).unwrap());
    let s = engine.snapshot(Instant::now());
    assert!(
        close(burn(&s, "avail", "5m"), 100.0),
        "ratio 1.0 over the new budget 0.01"
    );
    assert!(
        s.error_ratio.iter().all(|(l, _, _)| l.slo == "avail"),
        "removed SLOs are gone"
    );
}
