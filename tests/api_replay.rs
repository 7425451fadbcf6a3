//! Every API a real vLLM 0.32 serves, replayed from captures (`tests/fixtures/apis/`, with the
//! request that produced each): the observer fed each event at the time it reached the
//! client (the per-event arrival times in `.timing.jsonl`), and the sidecar forwarding each
//! capture byte for byte while it counts outcome, tokens and latency.

use crate::common::*;
use llmslo::observe::stream::{StreamObserver, StreamSummary};
use llmslo::record::Fault;
use llmslo::record::Protocol;
use std::time::Duration;
use tokio::time::Instant;

/// A capture's SSE events with their arrival times (ms after the request was sent).
fn timed_events(name: &str) -> Vec<(f64, Vec<u8>)> {
    let body = fixture(&format!("apis/{name}.sse"));
    let text = String::from_utf8(body).unwrap();
    let events: Vec<&str> = text.split_inclusive("\n\n").collect();
    let timing = String::from_utf8(fixture(&format!("apis/{name}.timing.jsonl"))).unwrap();
    let times: Vec<f64> = timing
        .lines()
        .skip(1)
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["t_ms"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(events.len(), times.len(), "{name}: one arrival time per event");
    times
        .into_iter()
        .zip(events.into_iter().map(|e| e.as_bytes().to_vec()))
        .collect()
}

fn protocol_of(name: &str) -> Protocol {
    match name.split('-').next().unwrap() {
        "responses" => Protocol::Responses,
        "messages" => Protocol::Messages,
        _ => Protocol::OpenAi,
    }
}

/// Feeds a capture event by event at its arrival time; returns the summary and the start.
fn replay(name: &str) -> (StreamSummary, Instant) {
    let base = Instant::now();
    let mut observer = StreamObserver::new(protocol_of(name), 1 << 20, false);
    for (t_ms, event) in timed_events(name) {
        observer.feed(&event, base + Duration::from_secs_f64(t_ms / 1e3), |_| {});
    }
    (observer.summary(), base)
}

fn ms(at: Option<Instant>, base: Instant) -> f64 {
    (at.expect("a time") - base).as_secs_f64() * 1e3
}

fn tpot_ms(summary: &StreamSummary) -> f64 {
    assert_eq!(summary.tpot_per_choice.len(), 1, "one output");
    summary.tpot_per_choice[0].as_secs_f64() * 1e3
}

/// (capture, arrival of the event holding the first token in ms, N, input tokens).
const STREAMS: [(&str, f64, u64, u64); 12] = [
    ("chat-continuous-usage", 79.97, 32, 41),
    ("chat-per-request-metrics", 109.608, 32, 22),
    ("chat-usage-logprobs", 1336.757, 32, 41),
    ("messages-stream", 82.385, 32, 41),
    ("messages-sampled-1", 79.047, 32, 41),
    ("messages-near-limit", 207.108, 31, 993),
    ("messages-per-request-metrics", 55.668, 32, 22),
    ("responses-stream", 152.131, 32, 41),
    ("responses-sampled-1", 75.167, 32, 41),
    ("responses-near-limit", 2673.04, 31, 993),
    ("responses-per-request-metrics", 100.326, 32, 22),
    ("responses-jsonschema", 124.245, 16, 41),
];

#[test]
fn every_api_shows_the_first_token_at_its_event_with_usage_counts() {
    for (name, first_ms, n, input) in STREAMS {
        let (s, base) = replay(name);
        assert!(
            (ms(s.first_token, base) - first_ms).abs() < 1e-6,
            "{name}: TTFT at its first delta"
        );
        assert_eq!(
            s.first_answer_token, s.first_token,
            "{name}: no reasoning, the answer is first"
        );
        assert_eq!(s.output_tokens, Some(n), "{name}: N");
        assert_eq!(s.input_tokens, Some(input), "{name}: input tokens");
        assert!(s.saw_done && s.error.is_none(), "{name}: a complete success");
    }
}

#[test]
fn lifecycle_events_before_prefill_are_not_the_first_token() {
    // response.created comes about 2 ms after the request, long before the first delta.
    let (s, base) = replay("responses-sampled-1");
    assert!(
        ms(s.first_token, base) > 70.0,
        "response.created at 2.5 ms is not a token"
    );
    let (s, base) = replay("messages-stream");
    assert!(
        ms(s.first_token, base) > 82.0,
        "message_start (81.5 ms) marks the decode clock, not TTFT"
    );
}

/// The engine's own TPOT of the request where the capture states it; else TPOT of chat (and
/// completions) on the same server at the same prompt and load. The captures come from two
/// runs of the server: the default one, and one started
/// with `--enable-per-request-metrics` (names `*-per-request-metrics`), which decoded about 3 %
/// slower.
fn reference_ms(name: &str) -> f64 {
    if let Some((_, Some((_, _, tpot)))) = ENGINE_STATED.iter().find(|(n, _)| *n == name) {
        return *tpot;
    }
    chat_reference_ms(name)
}

/// TPOT of chat (and completions) on the same server at the same prompt and load.
fn chat_reference_ms(name: &str) -> f64 {
    let references: &[&str] = if name.ends_with("per-request-metrics") {
        &["chat-per-request-metrics", "completions-per-request-metrics"]
    } else {
        &["chat-continuous-usage"]
    };
    references.iter().map(|r| tpot_ms(&replay(r).0)).sum::<f64>() / references.len() as f64
}

#[test]
fn responses_and_messages_tpot_agree_with_the_engine_or_chat_within_3_percent() {
    // Held-back tokens: 32 tokens arrive in 17 to 32 deltas; the last ten of
    // *-per-request-metrics only with the event that closes the output.
    for name in [
        "messages-stream",
        "messages-sampled-1",
        "messages-per-request-metrics",
        "responses-stream",
        "responses-sampled-1",
        "responses-per-request-metrics",
        "responses-jsonschema",
    ] {
        let reference = reference_ms(name);
        assert!((25.0..28.0).contains(&reference), "{reference}");
        let tpot = tpot_ms(&replay(name).0);
        let error = (tpot - reference) / reference;
        eprintln!(
            "{name}: TPOT {tpot:.2} ms, reference {reference:.2} ms ({:+.1} %)",
            error * 100.0
        );
        assert!(
            error.abs() <= 0.03,
            "{name}: TPOT {tpot:.2} ms against {reference:.2} ms ({:+.1} %)",
            error * 100.0
        );
    }
}

#[test]
fn the_naive_delta_tpot_is_what_held_back_tokens_bias() {
    // (last delta − first delta) / (N − 1) on the capture whose last ten tokens were held back.
    let events = timed_events("messages-per-request-metrics");
    let deltas: Vec<f64> = events
        .iter()
        .filter(|(_, e)| e.starts_with(b"event: content_block_delta"))
        .map(|(t, _)| *t)
        .collect();
    let naive = (deltas[deltas.len() - 1] - deltas[0]) / 31.0;
    let reference = chat_reference_ms("messages-per-request-metrics");
    assert!(
        naive < 0.8 * reference,
        "naive {naive:.1} ms is far below {reference:.1} ms"
    );
    let ours = tpot_ms(&replay("messages-per-request-metrics").0);
    assert!((ours - reference).abs() / reference <= 0.03, "{ours:.2}");
}

#[test]
fn a_first_delta_that_carries_held_back_tokens_is_read_from_the_gap_pattern() {
    // The greedy capture has a delta for each of its 32 tokens. Holding back its first six
    // (as a character of several tokens does, CJK or an emoji) sends them in one delta at the
    // sixth's time, with the later gaps as they were: each one decode step.
    let events = timed_events("responses-stream");
    let is_delta = |e: &[u8]| e.starts_with(b"event: response.output_text.delta");
    let deltas: Vec<usize> = (0..events.len()).filter(|&i| is_delta(&events[i].1)).collect();
    assert_eq!(deltas.len(), 32);
    let merged =
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"漢\"}\n\n";
    let base = Instant::now();
    let mut observer = StreamObserver::new(Protocol::Responses, 1 << 20, false);
    for (i, (t_ms, event)) in events.iter().enumerate() {
        if deltas[..5].contains(&i) {
            continue;
        }
        let event = if i == deltas[5] {
            merged.as_bytes()
        } else {
            event.as_slice()
        };
        observer.feed(event, base + Duration::from_secs_f64(t_ms / 1e3), |_| {});
    }
    let held = tpot_ms(&observer.summary());
    let whole = tpot_ms(&replay("responses-stream").0);
    assert!(
        (held - whole).abs() / whole <= 0.03,
        "{held:.2} ms with six tokens in the first delta, {whole:.2} ms with a delta each"
    );
    // Spread by characters, the first delta's one character of the answer's many would have
    // carried one token: 26 steps over 31, a TPOT 16 % low.
    let span = events[deltas[31]].0 - events[deltas[5]].0;
    assert!(span / 31.0 < 0.87 * whole, "{}", span / 31.0);
}

#[test]
fn under_eight_clients_tpot_agrees_with_the_engines_for_95_percent_of_requests() {
    // Real arrival times of 400 requests, most with held-back tokens; each request replayed
    // as the events the client got, its TPOT against the engine's own mean inter-token latency.
    let text = String::from_utf8(fixture("apis/responses-8-clients.jsonl")).unwrap();
    let mut errors = Vec::new();
    for line in text.lines() {
        let request: serde_json::Value = serde_json::from_str(line).unwrap();
        let base = Instant::now();
        let at = |ms: f64| base + Duration::from_secs_f64(ms / 1e3);
        let mut observer = StreamObserver::new(Protocol::Responses, 1 << 20, false);
        for delta in request["deltas"].as_array().unwrap() {
            let event = serde_json::json!({"type": "response.output_text.delta", "delta": delta[1]});
            let event = format!("event: response.output_text.delta\ndata: {event}\n\n");
            observer.feed(event.as_bytes(), at(delta[0].as_f64().unwrap()), |_| {});
        }
        let done = "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\"}\n\n";
        observer.feed(done.as_bytes(), at(request["done_ms"].as_f64().unwrap()), |_| {});
        let completed = format!(
            "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"status\":\"completed\",\
             \"usage\":{{\"output_tokens\":{}}}}}}}\n\n",
            request["output_tokens"]
        );
        observer.feed(
            completed.as_bytes(),
            at(request["completed_ms"].as_f64().unwrap()),
            |_| {},
        );
        let engine = request["engine_mean_itl_ms"].as_f64().unwrap();
        errors.push((tpot_ms(&observer.summary()) - engine) / engine);
    }
    assert_eq!(errors.len(), 400);
    let within = errors.iter().filter(|e| e.abs() <= 0.05).count() as f64 / errors.len() as f64;
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    eprintln!("within 5 %: {:.1} %, mean error {:+.2} %", within * 100.0, mean * 100.0);
    assert!(within >= 0.95, "{:.1} % within 5 %", within * 100.0);
    assert!(mean.abs() < 0.01, "mean error {:+.2} %", mean * 100.0);
}

#[test]
fn the_engines_own_view_of_the_same_request_agrees() {
    // vLLM's per-request metrics on the capture itself: mean inter-token latency 26.63 ms.
    let ours = tpot_ms(&replay("responses-per-request-metrics").0);
    assert!((ours - 26.625).abs() / 26.625 <= 0.03, "{ours:.2}");
}

/// The engine's per-request metrics each capture states: (queue, scheduled to first token,
/// mean inter-token latency), in ms, as the capture's own `metrics` object says.
type Stated = Option<(f64, f64, f64)>;
const ENGINE_STATED: [(&str, Stated); 5] = [
    (
        "chat-per-request-metrics",
        Some((0.1416800000697549, 68.7657369999215, 27.792556935486164)),
    ),
    (
        "completions-per-request-metrics",
        Some((0.024275999749079347, 38.223643000037555, 25.909524935492126)),
    ),
    (
        "responses-per-request-metrics",
        Some((0.027891000172530767, 45.60035099984816, 26.625395096773225)),
    ),
    // vLLM states them only beside usage, and the Messages API has no place for them.
    ("chat-per-request-metrics-nousage", None),
    ("messages-per-request-metrics", None),
];

#[test]
fn the_engines_per_request_phases_are_read_exactly_where_the_stream_states_them() {
    for (name, stated) in ENGINE_STATED {
        let engine = replay(name).0.engine;
        let read = engine.map(|e| (e.queue.unwrap() * 1e3, e.prefill.unwrap() * 1e3, e.tpot.unwrap() * 1e3));
        match (read, stated) {
            (Some(read), Some(stated)) => {
                for (a, b) in [(read.0, stated.0), (read.1, stated.1), (read.2, stated.2)] {
                    assert!((a - b).abs() < 1e-9, "{name}: {a} against {b}");
                }
            }
            (read, stated) => assert_eq!(read.is_some(), stated.is_some(), "{name}"),
        }
        assert_eq!(engine.and_then(|e| e.draft_acceptance), None, "{name}: no speculation");
    }
}

#[test]
fn near_the_context_limit_every_token_has_its_delta_and_tpot_is_exact() {
    // A 993-token prompt: every one of the 31 tokens has its own delta, so TPOT is the
    // delta cadence, whatever the held-back rule.
    for name in ["messages-near-limit", "responses-near-limit"] {
        let events = timed_events(name);
        let deltas: Vec<f64> = events
            .iter()
            .filter(|(_, e)| {
                e.starts_with(b"event: response.output_text.delta\n") || e.starts_with(b"event: content_block_delta\n")
            })
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(deltas.len(), 31, "{name}");
        let cadence = (deltas[30] - deltas[0]) / 30.0;
        let ours = tpot_ms(&replay(name).0);
        assert!(
            (ours - cadence).abs() / cadence < 0.001,
            "{name}: {ours:.3} against {cadence:.3}"
        );
    }
}

#[test]
fn an_in_band_invalid_request_is_the_clients_fault() {
    for name in ["chat-toplogprobs50", "completions-logprobs50"] {
        let (s, _) = replay(name);
        assert_eq!(s.error, Some(Fault::Client), "{name}");
        assert!(s.first_token.is_none());
    }
}

#[test]
fn a_responses_stream_that_closes_without_its_terminal_event_is_cut_short() {
    let (s, _) = replay("responses-toplogprobs50");
    assert!(!s.saw_done && s.error.is_none() && s.first_token.is_none());
}

/// The request that produced a capture (the sampled captures share one request file).
fn request_of(name: &str) -> String {
    let file = name.trim_end_matches("-1");
    String::from_utf8(fixture(&format!("apis/requests/{file}.json"))).unwrap()
}

/// The capture's response head as a script: status line and headers.
fn head_of(name: &str) -> (u16, String) {
    let raw = String::from_utf8(fixture(&format!("apis/{name}.headers"))).unwrap();
    let status: u16 = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type = raw
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("content-type"))
        .unwrap()
        .trim()
        .to_string();
    (status, content_type)
}

/// The whole capture as a scripted engine answer, one event per chunk; a stream that ended
/// without its terminal event is cut short the same way.
fn script_of(name: &str) -> (Script, Vec<u8>) {
    let (status, content_type) = head_of(name);
    let reason = if status == 200 { "OK" } else { "Error" };
    let stream = content_type.contains("event-stream");
    let body = fixture(&format!("apis/{name}.{}", if stream { "sse" } else { "json" }));
    // The events up to the first delta come when the capture received them (what the engine
    // states of its own time to first token fits within that), the rest a millisecond apart.
    let pieces = if stream {
        let mut previous = 0.0;
        let mut delta_seen = false;
        timed_events(name)
            .into_iter()
            .map(|(t_ms, e)| {
                let gap = if delta_seen {
                    Duration::from_millis(1)
                } else {
                    Duration::from_secs_f64((t_ms - previous).max(0.0) / 1e3)
                };
                previous = t_ms;
                delta_seen |= e.windows(5).any(|w| w == b"delta");
                (gap, e)
            })
            .collect()
    } else {
        vec![(Duration::ZERO, body.clone())]
    };
    let script = Script {
        head: format!("HTTP/1.1 {status} {reason}\r\n{content_type}\r\ntransfer-encoding: chunked"),
        pieces,
        cut_short: name == "responses-toplogprobs50",
        silent: false,
        trailers: String::new(),
    };
    (script, body)
}

/// As [`script_of`], each event sent when the capture received it.
fn timed_script_of(name: &str) -> Script {
    let (mut script, _) = script_of(name);
    let mut previous = 0.0;
    for ((t_ms, _), piece) in timed_events(name).into_iter().zip(script.pieces.iter_mut()) {
        piece.0 = Duration::from_secs_f64((t_ms - previous) / 1e3);
        previous = t_ms;
    }
    script
}

/// (capture, outcome, output tokens, input tokens).
const THROUGH_THE_SIDECAR: [(&str, &str, u64, u64); 20] = [
    ("chat-continuous-usage", "success", 32, 41),
    ("chat-toplogprobs50", "client_error", 0, 0),
    ("completions-logprobs50", "client_error", 0, 0),
    ("responses-stream", "success", 32, 41),
    ("responses-sampled-1", "success", 32, 41),
    ("responses-jsonschema", "success", 16, 41),
    ("responses-nostream", "success", 32, 41),
    ("responses-badmodel", "client_error", 0, 0),
    ("responses-toolong", "client_error", 0, 0),
    ("responses-toplogprobs50", "upstream_error", 0, 0),
    ("responses-per-request-metrics", "success", 32, 22),
    ("messages-stream", "success", 32, 41),
    ("messages-sampled-1", "success", 32, 41),
    ("messages-nostream", "success", 32, 41),
    ("messages-badmodel", "client_error", 0, 0),
    ("messages-toolong", "client_error", 0, 0),
    ("messages-thinking", "client_error", 0, 0),
    ("messages-tools", "client_error", 0, 0),
    ("messages-per-request-metrics", "success", 32, 22),
    ("embeddings", "client_error", 0, 0),
];

/// The route and `operation` of a capture, from its name.
fn api_of(name: &str) -> (&'static str, &'static str) {
    match name.split('-').next().unwrap() {
        "chat" => ("/v1/chat/completions", "chat"),
        "completions" => ("/v1/completions", "text_completion"),
        "responses" => ("/v1/responses", "responses"),
        "messages" => ("/v1/messages", "messages"),
        "embeddings" => ("/v1/embeddings", "embeddings"),
        other => panic!("no API for {other}"),
    }
}

#[tokio::test]
async fn every_capture_passes_byte_for_byte_and_is_counted_right() {
    for (name, outcome, output, input) in THROUGH_THE_SIDECAR {
        let (route, operation) = api_of(name);
        let (script, body) = script_of(name);
        let (upstream, _) = scripted_upstream(script).await;
        let slos = "engine: vllm\nslos:\n  - {name: availability, objective: 99.9, availability: true}\n";
        let sidecar = start_sidecar(upstream, slos).await;
        let request = request_of(name);
        let response = post(sidecar.proxy_addr, route, request).await;
        let status = response.status().as_u16();
        let received = http_body_util::BodyExt::collect(response.into_body())
            .await
            .map(|b| b.to_bytes());
        let metrics = settled(&sidecar).await;
        if name == "responses-toplogprobs50" {
            // The engine closed the connection mid-body: the client sees the same break.
            assert!(received.is_err(), "{name}");
        } else {
            assert_eq!(status, head_of(name).0, "{name}");
            assert_eq!(received.unwrap(), body, "{name}: bytes in equal bytes out");
        }
        let labels = [("operation", operation), ("outcome", outcome)];
        assert_eq!(
            sample(&metrics, "llmslo_requests_total", &labels),
            1.0,
            "{name}\n{metrics}"
        );
        let ops = [("operation", operation)];
        assert_eq!(
            sample(&metrics, "llmslo_output_tokens_total", &ops),
            output as f64,
            "{name}"
        );
        assert_eq!(
            sample(&metrics, "llmslo_input_tokens_total", &ops),
            input as f64,
            "{name}"
        );
        let streamed = output > 0 && !name.ends_with("nostream");
        let ttft = sample(&metrics, "gen_ai_server_time_to_first_token_seconds_count", &ops);
        let answer = sample(&metrics, "llmslo_time_to_first_answer_token_seconds_count", &ops);
        assert_eq!((ttft, answer), if streamed { (1.0, 1.0) } else { (0.0, 0.0) }, "{name}");
        let tpot = sample(&metrics, "gen_ai_server_time_per_output_token_seconds_count", &ops);
        assert_eq!(tpot, if streamed { 1.0 } else { 0.0 }, "{name}");
        let bases: f64 = ["stream", "engine", "estimated"]
            .iter()
            .map(|basis| sample(&metrics, "llmslo_tpot_basis_total", &[("basis", basis)]))
            .sum();
        assert_eq!(bases, tpot, "{name}: each TPOT says how it was known");
        if let Some((_, Some((queue_ms, prefill_ms, _)))) = ENGINE_STATED.iter().find(|(n, _)| *n == name) {
            let queue = sample(&metrics, "llmslo_engine_queue_time_seconds_sum", &ops);
            assert!((queue - queue_ms / 1e3).abs() < 1e-12, "{name}: {queue}");
            let engine_ttft = sample(&metrics, "llmslo_engine_queued_to_first_token_seconds_sum", &ops);
            assert!((engine_ttft - (queue_ms + prefill_ms) / 1e3).abs() < 1e-12, "{name}");
            let ttft = sample(&metrics, "gen_ai_server_time_to_first_token_seconds_sum", &ops);
            let outside = sample(&metrics, "llmslo_time_outside_engine_seconds_sum", &ops);
            assert!(
                (outside - (ttft - engine_ttft).max(0.0)).abs() < 1e-9,
                "{name}: {outside}"
            );
            for family in [
                "llmslo_engine_prefill_time_seconds_count",
                "llmslo_engine_time_per_output_token_seconds_count",
            ] {
                assert_eq!(sample(&metrics, family, &ops), 1.0, "{name}: {family}");
            }
        } else {
            assert!(!metrics.contains("llmslo_engine_queue_time_seconds_count{"), "{name}");
        }
        let availability_bad = if outcome == "upstream_error" { 1.0 } else { 0.0 };
        let bad = sample(&metrics, "llmslo_slo_bad_events_total", &[("slo", "availability")]);
        assert_eq!(
            bad, availability_bad,
            "{name}: only the engine's faults burn the budget"
        );
        sidecar.shutdown().await;
    }
}

#[tokio::test]
async fn responses_and_messages_ttft_is_timed_at_the_first_delta_through_the_sidecar() {
    for (name, route, first_ms) in [
        ("responses-sampled-1", "/v1/responses", 75.167),
        ("messages-stream", "/v1/messages", 82.385),
    ] {
        let (upstream, _) = scripted_upstream(timed_script_of(name)).await;
        let sidecar = start_sidecar(
            upstream,
            "engine: vllm\nslos:\n  - {name: fast, objective: 99, ttft: 1s}\n",
        )
        .await;
        let request = request_of(name);
        let (status, _) = post_collect(sidecar.proxy_addr, route, request).await;
        assert_eq!(status, 200);
        let metrics = settled(&sidecar).await;
        let ttft = sample(&metrics, "gen_ai_server_time_to_first_token_seconds_sum", &[]) * 1e3;
        assert!(
            ttft >= first_ms && ttft < first_ms + 20.0,
            "{name}: TTFT {ttft:.1} ms, first delta sent at {first_ms} ms"
        );
        let good = sample(&metrics, "llmslo_slo_events_total", &[("slo", "fast")]);
        assert_eq!(good, 1.0, "{name}: a valid event of the TTFT SLO");
        sidecar.shutdown().await;
    }
}

#[tokio::test]
async fn each_tpot_says_whether_the_stream_the_engine_or_an_estimate_gave_it() {
    // At the captures' own times, through a sidecar for vLLM: the sampled Responses answer
    // held tokens back with nothing to say when they were made (an estimate) unless the
    // answer states the engine's own figure; Messages' `message_start` marks the first
    // token, so its clock is the stream's, held-back tokens or not.
    for (name, route, basis) in [
        ("responses-stream", "/v1/responses", "stream"),
        ("responses-sampled-1", "/v1/responses", "estimated"),
        ("responses-per-request-metrics", "/v1/responses", "engine"),
        ("messages-sampled-1", "/v1/messages", "stream"),
    ] {
        let (upstream, _) = scripted_upstream(timed_script_of(name)).await;
        let sidecar = start_sidecar(upstream, "engine: vllm\n").await;
        let (status, _) = post_collect(sidecar.proxy_addr, route, request_of(name)).await;
        assert_eq!(status, 200);
        let metrics = settled(&sidecar).await;
        for counted in ["stream", "engine", "estimated"] {
            let n = sample(&metrics, "llmslo_tpot_basis_total", &[("basis", counted)]);
            assert_eq!(n, f64::from(u8::from(counted == basis)), "{name}: {counted}");
        }
        if basis == "engine" {
            let tpot = sample(&metrics, "gen_ai_server_time_per_output_token_seconds_sum", &[]);
            assert!((tpot * 1e3 - reference_ms(name)).abs() < 1e-6, "{name}: {tpot}");
        }
        sidecar.shutdown().await;
    }
}
