//! Why an SLO burns, on the batching simulator stating each request's own timing (as vLLM
//! does with `--enable-per-request-metrics`): induced queueing, long-prompt prefill and
//! decode contention each get the right cause for at least 90 % of the bad events, and the
//! client never sees the engine's metrics it did not ask for.

use crate::common::*;
use llmslo::tools::simulate::batching::BatchingOptions;
use llmslo::tools::simulate::SimOptions;
use std::time::Duration;

fn engine(max_batch: usize, prefill_per_token: Duration) -> SimOptions {
    SimOptions {
        batching: Some(BatchingOptions {
            step_base: Duration::from_millis(10),
            step_per_seq: Duration::from_millis(1),
            prefill_per_token,
            max_batch,
            kv_tokens: None,
            step_jitter: 0.0,
        }),
        per_request_metrics: true,
        ..SimOptions::default()
    }
}

/// A streamed chat request of `prompt_chars` characters (a quarter as many tokens) for
/// `max_tokens`, without `include_usage`: llmslo asks for it and hides it again.
fn request(prompt_chars: usize, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "sim",
        "messages": [{"role": "user", "content": "x".repeat(prompt_chars)}],
        "max_tokens": max_tokens,
        "stream": true,
    })
    .to_string()
}

/// Sends `rounds` rounds of `clients` requests at once; each body must carry no usage and
/// no metrics (the client did not ask for them).
async fn load(proxy: std::net::SocketAddr, clients: usize, rounds: usize, body: String) {
    for _ in 0..rounds {
        let requests: Vec<_> = (0..clients)
            .map(|_| tokio::spawn(post_collect(proxy, "/v1/chat/completions", body.clone())))
            .collect();
        for request in requests {
            let (status, bytes) = request.await.unwrap();
            assert_eq!(status, 200);
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            assert!(text.ends_with("data: [DONE]\n\n"));
            assert!(!text.contains("\"usage\"") && !text.contains("\"metrics\""), "{text}");
        }
    }
}

/// The share of `slo`'s bad events attributed to `cause`, and how many bad events there were.
fn share(text: &str, slo: &str, cause: &str) -> (f64, f64) {
    let bad = sample(text, "llmslo_slo_bad_events_total", &[("slo", slo)]);
    let attributed: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("llmslo_slo_bad_events_by_cause_total{")
                && l.contains(&format!("slo=\"{slo}\""))
                && l.contains(&format!("cause=\"{cause}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    let all: f64 = text
        .lines()
        .filter(|l| l.starts_with("llmslo_slo_bad_events_by_cause_total{") && l.contains(&format!("slo=\"{slo}\"")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(all, bad, "every bad event of {slo} has one cause:\n{text}");
    eprintln!("{slo}: {attributed} of {bad} bad events attributed to {cause}");
    (attributed / bad, bad)
}

const SLOS: &str = "engine_metrics_interval: 1s\nslos:\n  - {name: ttft, objective: 99, ttft: 200ms}\n  \
                    - {name: tpot, objective: 99, tpot: 30ms}\n";

async fn run(options: SimOptions, clients: usize, rounds: usize, body: String) -> String {
    run_with(SLOS, options, clients, rounds, body).await
}

async fn run_with(slos: &str, options: SimOptions, clients: usize, rounds: usize, body: String) -> String {
    let (upstream, stop) = start_engine(options).await;
    let sidecar = start_sidecar(upstream, slos).await;
    load(sidecar.proxy_addr, clients, rounds, body).await;
    let text = settled(&sidecar).await;
    sidecar.shutdown().await;
    stop.cancel();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_for_a_full_batch_burn_ttft_by_queueing() {
    // Four run at once; the other twelve wait 1-3 batches of 20 steps of 14 ms.
    let text = run(engine(4, Duration::ZERO), 16, 2, request(40, 20)).await;
    let (queueing, bad) = share(&text, "ttft", "queueing");
    assert!(bad >= 20.0, "{bad} bad events");
    assert!(queueing >= 0.9, "queueing {queueing}\n{text}");
    assert!(
        sample(&text, "llmslo_engine_queue_time_seconds_count", &[]) >= 32.0,
        "every request's queue time was read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompts_burn_ttft_by_prefill() {
    // 4000 prompt tokens at 100 us each: 400 ms of prefill, alone on the engine.
    // Two more TTFT SLOs account for prompt length: one judges only prompts up to 2000
    // tokens, one allows 100 ms per 1000 prompt tokens (600 ms here).
    let slos = format!(
        "{SLOS}  - {{name: ttft-short, objective: 99, ttft: 200ms, max_prompt_tokens: 2000}}\n  \
         - {{name: ttft-scaled, objective: 99, ttft: 200ms, per_1k_prompt_tokens: 100ms}}\n"
    );
    let text = run_with(&slos, engine(256, Duration::from_micros(100)), 1, 8, request(16_000, 4)).await;
    let (prefill, bad) = share(&text, "ttft", "prefill");
    assert_eq!(bad, 8.0);
    assert!(prefill >= 0.9, "prefill {prefill}\n{text}");
    let events = |slo: &str| sample(&text, "llmslo_slo_events_total", &[("slo", slo)]);
    assert_eq!(events("ttft-short"), 0.0, "long prompts are not its events");
    assert_eq!(events("ttft-scaled"), 8.0);
    assert_eq!(
        sample(&text, "llmslo_slo_bad_events_total", &[("slo", "ttft-scaled")]),
        0.0,
        "about 410 ms against 200 + 4 x 100 ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowded_decode_burns_tpot_by_contention() {
    // 40 decoding at once: 10 + 40 x 1 = 50 ms a step against a 30 ms TPOT SLO.
    let text = run(engine(256, Duration::ZERO), 40, 2, request(40, 30)).await;
    let (contention, bad) = share(&text, "tpot", "decode_contention");
    assert!(bad >= 70.0, "{bad} bad events");
    assert!(contention >= 0.9, "decode_contention {contention}\n{text}");
    let (_, ttft_bad) = share(&text, "ttft", "queueing");
    assert!(ttft_bad < 0.1 * bad, "the first tokens came in time");
}
