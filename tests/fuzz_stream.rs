//! A seeded, structure-aware fuzz harness for the stream path: the SSE parser, the OpenAI,
//! Responses, Messages and TGI interpreters (with the repeated-shape shortcut) and the usage
//! stripper, driven through the real observed body exactly as
//! the proxy drives it, under arbitrary frame splits.
//!
//! Why not cargo-fuzz or AFL: cargo-fuzz needs a nightly toolchain, and cargo-afl needs AFL++
//! built on every machine that runs it; this harness runs on stable in the ordinary test run,
//! and every failure reproduces from the seed it prints. What it gives up, coverage guidance,
//! it makes up with inputs built from real vLLM captures and from the byte sequences the parser
//! branches on (CR, LF, CRLF split across frames, BOM, comments, multi-line data, usage-only
//! chunks, events larger than the limit).
//!
//! Invariants, for every input and every split:
//! - nothing panics;
//! - with stripping off, the bytes out are the bytes in;
//! - with stripping on, the bytes out are the bytes in minus exactly the usage-only event spans
//!   the observer reported;
//! - the events, and the measurement summary, are the same whatever the split.
//!
//! CI runs `FUZZ_DEFAULT` executions. A long run:
//! `LLMSLO_FUZZ_EXECUTIONS=10000000 cargo test --release --test integration fuzz_stream:: -- --nocapture`
//! (`LLMSLO_FUZZ_SEED` picks another start).

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use hyper::body::{Body, Frame};
use llmslo::observe::body::ObservedBody;
use llmslo::observe::recorder::{Recorder, RecorderSettings};
use llmslo::observe::sse::SseParser;
use llmslo::observe::stream::StreamObserver;
use llmslo::observe::tracker::RequestTracker;
use llmslo::record::Engine;
use llmslo::record::{Operation, Protocol};
use llmslo::{Measurement, MeasurementSettings};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Executions in an ordinary test run.
const FUZZ_DEFAULT: u64 = 20_000;

/// Pieces inputs are built from: what the parser and interpreters branch on.
const ATOMS: &[&[u8]] = &[
    b"data: ",
    b"data:",
    b"data",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b"\r\r",
    b": keep-alive\n\n",
    b"event: message\n",
    b"id: 7\n",
    b"retry: 10\n",
    b"\xEF\xBB\xBF",
    b"data: [DONE]\n\n",
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"h\xC3\xA9llo\"}}]}\n\n",
    b"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"},\"logprobs\":{\"content\":[{},{}]}}]}\n\n",
    b"data: {\"choices\":[{\"index\":0,\"text\":\"abc\",\"finish_reason\":null}]}\n\n",
    b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n",
    b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\r\n\r\n",
    b"data: {\"choices\":[],\r\ndata: \"usage\":{\"completion_tokens\":2}}\r\r",
    b"data: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n",
    b"data:{\"token\":{\"id\":1,\"text\":\"a\",\"logprob\":0,\"special\":false},\"generated_text\":null,\"details\":null}\n\n",
    b"data:{\"token\":{\"id\":2,\"text\":\"</s>\",\"special\":true},\"generated_text\":\"a\",\"details\":{\"generated_tokens\":2}}\n\n",
    b"event: response.output_text.delta\ndata: {\"delta\":\"h\\u00e9\",\"sequence_number\":4}\n\n",
    b"event: response.completed\ndata: {\"response\":{\"status\":\"incomplete\",\"usage\":{\"output_tokens\":3}}}\n\n",
    b"event: error\ndata: {\"type\":\"error\",\"code\":\"invalid_request_error\"}\n\n",
    b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9}}}\n\n",
    b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ab\"}}\n\n",
    b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"\\n\"}}\n\n",
    b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n",
    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
    b"{\"choices\":[",
    b"\"usage\":",
    b"\xF0\x9F\x98",
    b"\x80",
    b"\0",
];

/// The real captures the inputs also start from.
const FIXTURES: &[&str] = &[
    "vllm-chat.sse",
    "vllm-completions.sse",
    "vllm-chat-n2.sse",
    "vllm-chat-nousage.sse",
    "vllm-chat-continuous-usage.sse",
    "vllm-chat-eos.sse",
    "vllm-small-chat.sse",
    "apis/responses-sampled-1.sse",
    "apis/responses-stream.sse",
    "apis/messages-sampled-1.sse",
    "apis/messages-stream.sse",
];

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// One input: built from atoms, or a window of a capture, then mutated.
fn input(rng: &mut SmallRng, fixtures: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = if rng.random_bool(0.5) {
        (0..rng.random_range(1..40))
            .flat_map(|_| ATOMS[rng.random_range(0..ATOMS.len())].iter().copied())
            .collect()
    } else {
        let capture = &fixtures[rng.random_range(0..fixtures.len())];
        let start = rng.random_range(0..capture.len());
        let len = rng.random_range(0..=3000.min(capture.len() - start));
        capture[start..start + len].to_vec()
    };
    for _ in 0..rng.random_range(0..4) {
        mutate(rng, &mut bytes);
    }
    bytes
}

fn mutate(rng: &mut SmallRng, bytes: &mut Vec<u8>) {
    let at = rng.random_range(0..=bytes.len());
    match rng.random_range(0..5) {
        0 if at < bytes.len() => bytes[at] = rng.random(),
        1 => {
            let atom = ATOMS[rng.random_range(0..ATOMS.len())];
            bytes.splice(at..at, atom.iter().copied());
        }
        2 if at < bytes.len() => {
            let end = rng.random_range(at..=bytes.len().min(at + 64));
            bytes.drain(at..end);
        }
        3 => {
            // A run long enough to cross a small max_event_bytes.
            let run = vec![b'x'; rng.random_range(1..3000)];
            bytes.splice(at..at, run);
        }
        _ if at < bytes.len() => {
            let end = rng.random_range(at..=bytes.len().min(at + 200));
            let copy = bytes[at..end].to_vec();
            bytes.splice(end..end, copy);
        }
        _ => {}
    }
}

/// Cuts `bytes` into pieces at random points, single bytes included.
fn split(rng: &mut SmallRng, bytes: &[u8]) -> Vec<Bytes> {
    let mut pieces = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = match rng.random_range(0..4) {
            0 => 1,
            1 => rng.random_range(1..8),
            2 => rng.random_range(1..200),
            _ => rest.len(),
        }
        .min(rest.len());
        pieces.push(Bytes::copy_from_slice(&rest[..n]));
        rest = &rest[n..];
    }
    pieces
}

/// The upstream body: frames from a queue; `eager_end` says the end is known with the last
/// frame (Content-Length) rather than only after it (chunked).
struct Frames {
    queue: VecDeque<Bytes>,
    eager_end: bool,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.get_mut().queue.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.eager_end && self.queue.is_empty()
    }
}

/// Forwards `pieces` through the real observed body; returns the bytes the client gets.
fn forward(
    recorder: &Arc<Recorder>,
    operation: Operation,
    strip: bool,
    max: usize,
    pieces: Vec<Bytes>,
    eager_end: bool,
) -> Vec<u8> {
    let mut tracker = RequestTracker::start(recorder.clone(), Some("m"), operation, tokio::time::Instant::now(), max);
    if strip {
        tracker.strip_usage_chunk();
    }
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
    tracker.on_response_head(StatusCode::OK, &headers);
    let mut body = ObservedBody::new(
        Frames {
            queue: pieces.into(),
            eager_end,
        },
        tracker,
    );
    let mut out = Vec::new();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => out.extend_from_slice(frame.data_ref().expect("data frames only")),
            Poll::Ready(Some(Err(error))) => panic!("the body failed: {error}"),
            Poll::Ready(None) => return out,
            Poll::Pending => panic!("a body of ready frames never waits"),
        }
    }
}

/// An event's end as the whole stream shows it: an event ended by a `\r` that was the last
/// byte of a frame is dispatched before its `\n` arrives, which the end then takes in.
fn settled_end(bytes: &[u8], end: u64) -> u64 {
    let end_at = end as usize;
    if end_at > 0 && bytes[end_at - 1] == b'\r' && bytes.get(end_at) == Some(&b'\n') {
        end + 1
    } else {
        end
    }
}

type Events = Vec<(Vec<u8>, Vec<u8>, u64, u64)>;

/// Every event the parser dispatches for `pieces`: (type, data, start, end), and whether it gave up.
fn events(bytes: &[u8], max: usize, pieces: &[Bytes]) -> (Events, bool) {
    let mut parser = SseParser::new(max);
    let mut seen = Vec::new();
    for piece in pieces {
        parser.feed(piece, |e| {
            seen.push((
                e.event_type.to_vec(),
                e.data.to_vec(),
                e.start,
                settled_end(bytes, e.end),
            ))
        });
    }
    (seen, parser.gave_up())
}

/// The observer's summary and the usage spans it reported for `pieces`, all fed at one instant.
fn observed(
    bytes: &[u8],
    protocol: Protocol,
    max: usize,
    pieces: &[Bytes],
    now: tokio::time::Instant,
) -> (String, Vec<(u64, u64)>) {
    let mut observer = StreamObserver::new(protocol, max, true);
    let mut spans = Vec::new();
    for piece in pieces {
        observer.feed(piece, now, |_| {});
        spans.extend(
            observer
                .take_removable()
                .into_iter()
                .map(|(start, end)| (start, settled_end(bytes, end))),
        );
    }
    (format!("{:?}", observer.summary()), spans)
}

/// One execution: every invariant for one input under one split.
fn execute(recorder: &Arc<Recorder>, rng: &mut SmallRng, fixtures: &[Vec<u8>]) {
    let bytes = input(rng, fixtures);
    let max = [64, 256, 1024, 1 << 20][rng.random_range(0..4)];
    let (operation, protocol) = match rng.random_range(0..10) {
        0..=4 => (Operation::Chat, Protocol::OpenAi),
        5 | 6 => (Operation::Responses, Protocol::Responses),
        7 | 8 => (Operation::Messages, Protocol::Messages),
        _ => (Operation::Generate, Protocol::Tgi),
    };
    let whole = vec![Bytes::from(bytes.clone())];
    let pieces = split(rng, &bytes);

    // The same events and the same measurement whatever the split.
    assert_eq!(
        events(&bytes, max, &pieces),
        events(&bytes, max, &whole),
        "events differ by split"
    );
    let now = tokio::time::Instant::now();
    let (summary, spans) = observed(&bytes, protocol, max, &whole, now);
    assert_eq!(
        observed(&bytes, protocol, max, &pieces, now),
        (summary, spans.clone()),
        "observation differs by split"
    );

    // Stripping off: bytes out = bytes in.
    let eager_end = rng.random_bool(0.5);
    let out = forward(recorder, operation, false, max, pieces.clone(), eager_end);
    assert_eq!(out, bytes, "bytes changed without stripping");

    // Stripping on (only OpenAI streams are ever stripped): bytes in minus the usage spans.
    if protocol == Protocol::OpenAi {
        let mut expected = Vec::with_capacity(bytes.len());
        let mut cursor = 0;
        for &(start, end) in &spans {
            expected.extend_from_slice(&bytes[cursor..start as usize]);
            cursor = end as usize;
        }
        expected.extend_from_slice(&bytes[cursor..]);
        let out = forward(recorder, operation, true, max, pieces, eager_end);
        assert_eq!(
            out, expected,
            "stripping removed something other than the usage spans {spans:?}"
        );
    }
}

#[test]
fn stream_path_invariants_hold_under_arbitrary_splits() {
    let executions: u64 = std::env::var("LLMSLO_FUZZ_EXECUTIONS").map_or(FUZZ_DEFAULT, |v| v.parse().unwrap());
    let first_seed: u64 = std::env::var("LLMSLO_FUZZ_SEED").map_or(0, |v| v.parse().unwrap());
    let fixtures: Vec<Vec<u8>> = FIXTURES.iter().map(|name| fixture(name)).collect();
    let recorder = Measurement::new(MeasurementSettings {
        recorder: RecorderSettings {
            engine: Some(Engine::Vllm),
            ..RecorderSettings::default()
        },
        ..MeasurementSettings::default()
    })
    .recorder;
    let started = std::time::Instant::now();
    // One seed per execution: a failure names the seed that reproduces it alone.
    for seed in first_seed..first_seed + executions {
        let mut rng = SmallRng::seed_from_u64(seed);
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(&recorder, &mut rng, &fixtures)));
        if outcome.is_err() {
            panic!("fuzz execution failed; reproduce with LLMSLO_FUZZ_SEED={seed} LLMSLO_FUZZ_EXECUTIONS=1");
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!(
        "fuzz: {executions} executions from seed {first_seed} in {elapsed:.1} s ({:.0} per second)",
        executions as f64 / elapsed
    );
}
