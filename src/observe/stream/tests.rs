//! The stream observer's tests: every protocol's events, timed and counted.

use super::*;

fn observer() -> StreamObserver {
    StreamObserver::new(Protocol::OpenAi, 1 << 20, false)
}

#[tokio::test(start_paused = true)]
async fn ttft_tpot_and_gaps_from_timed_events() {
    let t0 = Instant::now();
    let mut obs = observer();
    let mut gaps = Vec::new();
    let role = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
    obs.feed(role, t0, |g| gaps.push(g));
    for i in 1..=4u64 {
        let now = t0 + Duration::from_millis(100 + 20 * (i - 1));
        obs.feed(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"token_ids\":[7]}]}\n\n",
            now,
            |g| gaps.push(g),
        );
    }
    obs.feed(b"data: [DONE]\n\n", t0 + Duration::from_millis(170), |g| gaps.push(g));
    let s = obs.summary();
    assert_eq!(s.first_token, Some(t0 + Duration::from_millis(100)));
    assert_eq!(s.output_tokens, Some(4));
    assert_eq!(s.count_source, Some(CountSource::TokenIds));
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(20)]);
    assert_eq!(s.tpot_basis, Some(TpotBasis::Stream));
    assert_eq!(gaps, vec![Duration::from_millis(20); 3]);
    assert!(s.saw_done && s.error.is_none());
    assert_eq!(obs.facts.choices.capacity(), 1, "one choice seen, one kept");
}

#[tokio::test(start_paused = true)]
async fn events_alone_leave_the_count_and_tpot_unknown() {
    let t0 = Instant::now();
    let mut obs = observer();
    let mut gaps = Vec::new();
    for i in 0..4u64 {
        let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\"four tokens maybe\"}}]}\n\n";
        obs.feed(chunk, t0 + Duration::from_millis(100 + 80 * i), |g| gaps.push(g));
    }
    let s = obs.summary();
    assert_eq!(
        s.first_token,
        Some(t0 + Duration::from_millis(100)),
        "TTFT needs no count"
    );
    assert_eq!(gaps, vec![Duration::from_millis(80); 3], "nor do the gaps");
    assert_eq!(s.count_source, Some(CountSource::Events));
    assert_eq!(s.output_tokens, None, "an event may hold several tokens");
    assert!(
        s.tpot_per_choice.is_empty(),
        "no TPOT that may be a multiple of the truth"
    );
}

#[tokio::test(start_paused = true)]
async fn usage_overrides_the_event_count() {
    let t0 = Instant::now();
    let mut obs = observer();
    obs.feed(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}\n\n",
        t0,
        |_| {},
    );
    obs.feed(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"def\"}}]}\n\n",
        t0 + Duration::from_millis(90),
        |_| {},
    );
    obs.feed(
        b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n",
        t0 + Duration::from_millis(91),
        |_| {},
    );
    let s = obs.summary();
    assert_eq!(s.output_tokens, Some(6));
    assert_eq!(s.count_source, Some(CountSource::Usage));
    assert_eq!(s.input_tokens, Some(5));
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(18)]);
    assert_eq!(s.token_events, 2);
}

#[tokio::test(start_paused = true)]
async fn single_token_event_has_no_tpot() {
    let t0 = Instant::now();
    let mut obs = observer();
    obs.feed(
        b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"token_ids\":[1]}]}\n\ndata: [DONE]\n\n",
        t0,
        |_| {},
    );
    assert!(obs.summary().tpot_per_choice.is_empty());
    assert_eq!(obs.summary().output_tokens, Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_held_back_start_delays_ttft_but_not_the_decode_clock() {
    let t0 = Instant::now();
    let mut obs = observer();
    let held = b"data: {\"choices\":[{\"delta\":{\"content\":\"\"},\"token_ids\":[1]}]}\n\n";
    let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"\xc3\xa9\"},\"token_ids\":[2]}]}\n\n";
    obs.feed(held, t0 + Duration::from_millis(100), |_| {});
    obs.feed(token, t0 + Duration::from_millis(130), |_| {});
    obs.feed(token, t0 + Duration::from_millis(160), |_| {});
    let s = obs.summary();
    assert_eq!(
        s.first_token,
        Some(t0 + Duration::from_millis(130)),
        "TTFT: the first thing a user sees"
    );
    assert_eq!(s.first_token_event, Some(t0 + Duration::from_millis(100)));
    assert_eq!(s.output_tokens, Some(3));
    assert_eq!(
        s.tpot_per_choice,
        [Duration::from_millis(30)],
        "three tokens, two decode steps of 30 ms"
    );
}

#[tokio::test(start_paused = true)]
async fn choices_are_timed_separately() {
    let t0 = Instant::now();
    let mut obs = observer();
    let mut gaps = Vec::new();
    let at = |ms| t0 + Duration::from_millis(ms);
    let chunk = |i: u32| {
        format!("data: {{\"choices\":[{{\"index\":{i},\"delta\":{{\"content\":\"x\"}},\"token_ids\":[3]}}]}}\n\n")
    };
    // Choice 1 starts first and streams every 10 ms; choice 0 every 30 ms.
    for (ms, i) in [(50, 1), (60, 1), (70, 1), (80, 0), (110, 0), (140, 0)] {
        obs.feed(chunk(i).as_bytes(), at(ms), |g| gaps.push(g));
    }
    let s = obs.summary();
    assert_eq!(s.first_token, Some(at(50)));
    assert_eq!(
        s.tpot_per_choice,
        [Duration::from_millis(30), Duration::from_millis(10)]
    );
    assert_eq!(gaps.len(), 4);
    assert_eq!(s.output_tokens, Some(6));
    assert_eq!(obs.facts.choices.capacity(), 2, "two choices seen, two kept");
}

#[tokio::test(start_paused = true)]
async fn tgi_stream_special_tokens_and_final_event() {
    let t0 = Instant::now();
    let mut obs = StreamObserver::new(Protocol::Tgi, 1 << 20, false);
    let event = |special: bool, last: bool| {
        format!(
            "data:{{\"index\":1,\"token\":{{\"id\":1,\"text\":\"a\",\"logprob\":0.0,\"special\":{special}}},\"generated_text\":{},\"details\":{}}}\n\n",
            if last { "\"aaa\"" } else { "null" },
            if last { "{\"generated_tokens\":3}" } else { "null" },
        )
    };
    obs.feed(event(true, false).as_bytes(), t0, |_| {});
    obs.feed(event(false, false).as_bytes(), t0 + Duration::from_millis(40), |_| {});
    obs.feed(event(false, true).as_bytes(), t0 + Duration::from_millis(60), |_| {});
    let s = obs.summary();
    assert_eq!(
        s.first_token,
        Some(t0 + Duration::from_millis(40)),
        "the special token is not content"
    );
    assert_eq!(s.output_tokens, Some(3));
    assert_eq!(
        s.tpot_per_choice,
        [Duration::from_millis(30)],
        "three tokens over 60 ms: decode starts at the first"
    );
    assert!(s.saw_done);
}

/// `n` choices interleaved, each event of `k` tokens (content only), one event every 40 ms
/// per choice; then the usage chunk with the total.
fn interleaved(obs: &mut StreamObserver, t0: Instant, events: &[(u32, u64)], total: Option<u64>) {
    for (step, (choice, ms)) in events.iter().enumerate() {
        let chunk =
            format!("data: {{\"choices\":[{{\"index\":{choice},\"delta\":{{\"content\":\"abcd{step}\"}}}}]}}\n\n");
        obs.feed(chunk.as_bytes(), t0 + Duration::from_millis(*ms), |_| {});
    }
    if let Some(total) = total {
        let usage = format!("data: {{\"choices\":[],\"usage\":{{\"completion_tokens\":{total}}}}}\n\n");
        obs.feed(usage.as_bytes(), t0 + Duration::from_secs(1), |_| {});
    }
}

#[tokio::test(start_paused = true)]
async fn n_choices_split_the_usage_total_by_their_events() {
    // Two choices, six events of four tokens each: 24 tokens a choice, 48 in all.
    let t0 = Instant::now();
    let mut obs = observer();
    let events: Vec<(u32, u64)> = (0..6).flat_map(|i| [(0, 100 + 40 * i), (1, 110 + 40 * i)]).collect();
    interleaved(&mut obs, t0, &events, Some(48));
    let s = obs.summary();
    assert_eq!(s.output_tokens, Some(48));
    let exact = Duration::from_millis(200).div_f64(23.0);
    assert_eq!(s.tpot_per_choice, [exact, exact], "200 ms over 23 steps, not over 5");
}

#[test]
fn the_total_is_split_by_largest_remainder_and_stated_counts_are_kept() {
    let choice = |events: u64, unstated: u64, stated: u64| ChoiceFacts {
        events,
        unstated_events: unstated,
        stated,
        ..ChoiceFacts::default()
    };
    let (a, b, c) = (choice(3, 3, 0), choice(6, 6, 0), choice(2, 0, 5));
    assert_eq!(split_total(34, &[&a, &b]), [Some(11), Some(23)]);
    assert_eq!(split_total(35, &[&a, &b, &c]), [Some(10), Some(20), Some(5)]);
    assert_eq!(split_total(5, &[&c]), [Some(5)]);
}

#[tokio::test(start_paused = true)]
async fn a_tokenizer_counts_what_the_stream_does_not_state() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let counting = Counting {
        empty_finish_is_no_token: false,
        tokenizer: Some(Arc::new(TokenCounter::load(&dir).unwrap())),
        mark_is_first_token: false,
    };
    let t0 = Instant::now();
    let mut obs = observer().with_counting(counting);
    for i in 0..5u64 {
        let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\" tok en tok en\"}}]}\n\n";
        obs.feed(chunk, t0 + Duration::from_millis(50 * i), |_| {});
    }
    let s = obs.summary();
    assert_eq!(s.count_source, Some(CountSource::Tokenizer));
    assert_eq!(s.output_tokens, Some(20));
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(200).div_f64(19.0)]);
}

#[tokio::test(start_paused = true)]
async fn llamacpps_empty_final_event_is_no_token() {
    let t0 = Instant::now();
    let stream = |obs: &mut StreamObserver| {
        for i in 0..3u64 {
            let chunk = b"data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n";
            obs.feed(chunk, t0 + Duration::from_millis(30 * i), |_| {});
        }
        let last = b"data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n";
        obs.feed(last, t0 + Duration::from_millis(90), |_| {});
        let usage = b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n";
        obs.feed(usage, t0 + Duration::from_millis(91), |_| {});
    };
    let llamacpp = Counting {
        empty_finish_is_no_token: true,
        tokenizer: None,
        mark_is_first_token: false,
    };
    let mut obs = observer().with_counting(llamacpp);
    stream(&mut obs);
    let s = obs.summary();
    assert_eq!(s.token_events, 3);
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(30)]);
    // vLLM's empty final event is its last token, its text held back.
    let mut vllm = observer();
    stream(&mut vllm);
    assert_eq!(vllm.summary().token_events, 4);
}

#[tokio::test(start_paused = true)]
async fn a_message_start_sent_before_prefill_does_not_start_the_decode_clock() {
    // Anthropic's own API sends `message_start` at once; the first token comes 500 ms later.
    let t0 = Instant::now();
    let mut obs = StreamObserver::new(Protocol::Messages, 1 << 20, false);
    let at = |ms| t0 + Duration::from_millis(ms);
    obs.feed(
        b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9}}}\n\n",
        at(0),
        |_| {},
    );
    for i in 0..5 {
        let delta = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n";
        obs.feed(delta, at(500 + 10 * i), |_| {});
    }
    let end = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    obs.feed(end, at(540), |_| {});
    let s = obs.summary();
    assert_eq!(s.first_token, Some(at(500)));
    assert_eq!(s.input_tokens, Some(9));
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(10)], "prefill is not decode");
    assert!(s.saw_done);
}

/// A Responses stream of `deltas` (text, ms) closed at `end` ms, `tokens` in all.
fn responses(deltas: &[(&str, u64)], end: u64, tokens: u64) -> (StreamSummary, Instant) {
    responses_stating(deltas, end, tokens, "")
}

/// As [`responses`], with `metrics` (a JSON object's members) in `response.completed`.
fn responses_stating(deltas: &[(&str, u64)], end: u64, tokens: u64, metrics: &str) -> (StreamSummary, Instant) {
    let t0 = Instant::now();
    let mut obs = StreamObserver::new(Protocol::Responses, 1 << 20, false);
    let at = |ms| t0 + Duration::from_millis(ms);
    for (text, ms) in deltas {
        let delta = format!("event: response.output_text.delta\ndata: {{\"delta\":\"{text}\"}}\n\n");
        obs.feed(delta.as_bytes(), at(*ms), |_| {});
    }
    let metrics = if metrics.is_empty() {
        String::new()
    } else {
        format!(",\"metrics\":{{{metrics}}}")
    };
    let completed = format!(
        "event: response.completed\ndata: {{\"response\":{{\"status\":\"completed\",\"usage\":{{\"output_tokens\":{tokens}}}{metrics}}}}}\n\n"
    );
    obs.feed(completed.as_bytes(), at(end), |_| {});
    (obs.summary(), t0)
}

#[tokio::test(start_paused = true)]
async fn the_gap_pattern_says_where_the_held_back_tokens_went() {
    // 10 tokens in 6 deltas, 20 ms a step: 4 held back. The third delta came two steps
    // after the second (one held-back token, here the rest of a character beyond ASCII);
    // the rest of the gaps are single steps, so the first delta carried the other three.
    let (s, t0) = responses(
        &[
            ("\\u00e4bcd", 100),
            ("ef", 120),
            ("é f", 160),
            ("ef", 180),
            ("ef", 200),
            ("ef", 220),
        ],
        221,
        10,
    );
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(20)]);
    assert_eq!(s.first_answer_token, Some(t0 + Duration::from_millis(100)));
}

#[tokio::test(start_paused = true)]
async fn with_too_few_gaps_for_a_pattern_the_first_delta_takes_its_share_by_characters() {
    // 7 tokens in 3 deltas: 4 held back. The first delta holds 4 of the 8 characters:
    // 1 + round(4 x 4 / 8) = 3 tokens in the first delta, 40 ms over 7 - 3 steps.
    let (s, _) = responses(&[("abcd", 100), ("ef", 120), ("ef", 140)], 140, 7);
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(10)]);
}

#[test]
fn usage_only_spans_are_marked_only_when_stripping() {
    let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
    let mut keep = observer();
    keep.feed(stream, Instant::now(), |_| {});
    assert!(keep.take_removable().is_empty());
    let mut strip = StreamObserver::new(Protocol::OpenAi, 1 << 20, true);
    strip.feed(stream, Instant::now(), |_| {});
    let spans = strip.take_removable();
    assert_eq!(spans.len(), 1);
    let (start, end) = (spans[0].0 as usize, spans[0].1 as usize);
    assert!(stream[start..end].starts_with(b"data: {\"choices\":[],\"usage\""));
    assert!(stream[end..].starts_with(b"data: [DONE]"));
    assert_eq!(strip.boundary(), stream.len() as u64);
}

#[tokio::test(start_paused = true)]
async fn held_back_tokens_take_the_engines_own_figure_within_reason() {
    // The stream of the gap-pattern test reads 20 ms; the engine states its own figure.
    let deltas = [
        ("ab", 100),
        ("ef", 120),
        ("é f", 160),
        ("ef", 180),
        ("ef", 200),
        ("ef", 220),
    ];
    let tpot = |metrics: &str| {
        let (s, _) = responses_stating(&deltas, 221, 10, metrics);
        (s.tpot_per_choice, s.tpot_basis)
    };
    assert_eq!(
        tpot(r#""mean_itl_ms": 24.5"#),
        (vec![Duration::from_micros(24_500)], Some(TpotBasis::Engine))
    );
    // Untrusted: beyond twice the stream's figure, under half of it, or past any duration.
    // The stream's figure stands, and says it is an estimate (four tokens were held back).
    for hostile in [r#""mean_itl_ms": 41"#, r#""mean_itl_ms": 9"#, r#""mean_itl_ms": 1e300"#] {
        assert_eq!(
            tpot(hostile),
            (vec![Duration::from_millis(20)], Some(TpotBasis::Estimated)),
            "{hostile}"
        );
    }
    assert_eq!(tpot("").1, Some(TpotBasis::Estimated), "no engine figure");
    // Every token with its delta: the stream's own figure is exact and stands.
    let whole = [("a", 100), ("b", 120), ("c", 140)];
    let (s, _) = responses_stating(&whole, 140, 3, r#""mean_itl_ms": 30"#);
    assert_eq!(s.tpot_per_choice, [Duration::from_millis(20)]);
    assert_eq!(s.tpot_basis, Some(TpotBasis::Stream));
}
