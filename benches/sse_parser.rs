//! Throughput of the SSE parser and of parser + OpenAI interpreter on real vLLM captures,
//! next to a plain newline scan over the same bytes as the same-run baseline; and the cost
//! per event of each wire protocol's interpreter on one 32-token answer from each API, alone and
//! among a thousand streams.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use llmslo::observe::repeat::RepeatSummariser;
use llmslo::observe::sse::SseParser;
use llmslo::observe::stream::StreamObserver;
use llmslo::record::Protocol;
use std::hint::black_box;
use std::time::Duration;
use tokio::time::Instant;

const CAPTURES: [&str; 5] = [
    "vllm-chat.sse",
    "vllm-completions.sse",
    "vllm-chat-eos.sse",
    "vllm-chat-n2.sse",
    "vllm-chat-continuous-usage.sse",
];

/// The captures, each cut into frames the way the network delivered them: one event each.
fn streams() -> Vec<Vec<Vec<u8>>> {
    CAPTURES
        .iter()
        .map(|name| {
            let bytes = std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
            bytes
                .split_inclusive(|b| *b == b'\n')
                .filter(|l| *l != b"\n")
                .map(<[u8]>::to_vec)
                .collect()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let streams = streams();
    let total: usize = streams.iter().flatten().map(Vec::len).sum::<usize>() + streams.iter().flatten().count();
    let mut group = c.benchmark_group("sse");
    group.throughput(Throughput::Bytes(total as u64));
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    group.bench_function("baseline_newline_scan", |b| {
        b.iter(|| {
            let mut lines = 0;
            for frame in streams.iter().flatten() {
                lines += memchr::memchr_iter(b'\n', black_box(frame)).count();
            }
            black_box(lines)
        })
    });
    group.bench_function("parser", |b| {
        b.iter(|| {
            let mut events = 0;
            for stream in &streams {
                let mut parser = SseParser::new(1 << 20);
                for frame in stream {
                    parser.feed(black_box(frame), |_| events += 1);
                    parser.feed(b"\n", |_| events += 1);
                }
            }
            black_box(events)
        })
    });
    let now = Instant::now();
    group.bench_function("parser_and_interpreter", |b| {
        b.iter(|| {
            let mut tokens = 0;
            for stream in &streams {
                let mut observer = StreamObserver::new(Protocol::OpenAi, 1 << 20, false);
                for frame in stream {
                    observer.feed(black_box(frame), now, |_| {});
                    observer.feed(b"\n", now, |_| {});
                }
                tokens += observer.summary().output_tokens.unwrap_or(0);
            }
            black_box(tokens)
        })
    });
    group.finish();
}

/// A 32-token greedy answer from each API of the same vLLM, cut into one frame per event.
const PER_API: [(&str, Protocol, &str); 3] = [
    ("chat", Protocol::OpenAi, "vllm-chat-raw32.sse"),
    ("responses", Protocol::Responses, "apis/responses-stream.sse"),
    ("messages", Protocol::Messages, "apis/messages-stream.sse"),
];

/// A capture's events, each with the blank line that ends it: one network frame each.
fn events_of(bytes: &[u8]) -> Vec<&[u8]> {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .collect::<Vec<_>>()
        .chunk_by(|line, _| *line != b"\n")
        .map(|lines| {
            let start = lines[0].as_ptr() as usize - bytes.as_ptr() as usize;
            &bytes[start..start + lines.iter().map(|l| l.len()).sum::<usize>()]
        })
        .collect()
}

fn per_event(c: &mut Criterion) {
    let now = Instant::now();
    let mut group = c.benchmark_group("per_event");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (api, protocol, capture) in PER_API {
        let bytes = std::fs::read(format!("{}/tests/fixtures/{capture}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let events = events_of(&bytes);
        group.throughput(Throughput::Elements(events.len() as u64));
        group.bench_function(api, |b| {
            b.iter(|| {
                let mut observer = StreamObserver::new(protocol, 1 << 20, false);
                for event in &events {
                    observer.feed(black_box(event), now, |_| {});
                }
                black_box(observer.summary().output_tokens)
            })
        });
    }
    group.finish();
}

/// Concurrent streams in [`per_event_among_streams`].
const STREAMS: usize = 1000;

/// What a proxy holds per stream besides the observer (hyper's buffers: about 32 KiB), so that
/// a thousand streams, like a proxy's, do not fit in the cache.
const HELD_PER_STREAM: usize = 32 << 10;

/// The chat answer's events as a proxy sees them with a thousand streams open: each event lands
/// in its own stream's read buffer and is fed to that stream's observer, one stream after the
/// other, so that every stream's state has left the cache by its next event. Beside it, the
/// same copies without the observer, as the same-run baseline.
fn per_event_among_streams(c: &mut Criterion) {
    let now = Instant::now();
    let bytes = std::fs::read(format!(
        "{}/tests/fixtures/vllm-chat-raw32.sse",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let events = events_of(&bytes);
    let mut group = c.benchmark_group("per_event_among_1000_streams");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements((STREAMS * events.len()) as u64));
    let mut held: Vec<Vec<u8>> = (0..STREAMS).map(|_| vec![1u8; HELD_PER_STREAM]).collect();
    // Each event is written at the next place in its stream's buffer, as a read buffer fills.
    let place = |buffer: &mut [u8], round: usize, event: &[u8]| {
        let at = (round * 512) % (buffer.len() - event.len());
        buffer[at..at + event.len()].copy_from_slice(event);
        at..at + event.len()
    };
    group.bench_function("baseline_copy_only", |b| {
        b.iter(|| {
            let mut sum = 0u64;
            for (round, event) in events.iter().enumerate() {
                for buffer in held.iter_mut() {
                    let span = place(buffer, round, event);
                    sum += u64::from(black_box(&buffer[span])[0]);
                }
            }
            black_box(sum)
        })
    });
    group.bench_function("observer", |b| {
        b.iter_batched_ref(
            || {
                (0..STREAMS)
                    .map(|_| StreamObserver::new(Protocol::OpenAi, 1 << 20, false))
                    .collect::<Vec<_>>()
            },
            |observers| {
                for (round, event) in events.iter().enumerate() {
                    for (observer, buffer) in observers.iter_mut().zip(held.iter_mut()) {
                        let span = place(buffer, round, event);
                        observer.feed(&buffer[span], now, |_| {});
                    }
                }
                black_box(observers[0].summary().output_tokens)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

/// The interpreters alone, on events already framed: what each protocol costs per event.
fn interpreter(c: &mut Criterion) {
    let mut group = c.benchmark_group("interpreter");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (api, protocol, capture) in PER_API {
        let bytes = std::fs::read(format!("{}/tests/fixtures/{capture}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let mut events: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        SseParser::new(1 << 20).feed(&bytes, |e| events.push((e.event_type.to_vec(), e.data.to_vec())));
        group.throughput(Throughput::Elements(events.len() as u64));
        group.bench_function(api, |b| {
            b.iter(|| {
                let mut repeat = RepeatSummariser::new(protocol);
                let mut tokens = 0;
                for (event_type, data) in &events {
                    tokens += u32::from(repeat.summarise(black_box(event_type), black_box(data)).has_tokens);
                }
                black_box(tokens)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench, per_event, per_event_among_streams, interpreter);
criterion_main!(benches);
