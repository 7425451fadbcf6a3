//! Throughput of the SSE parser and of parser + OpenAI interpreter on real vLLM captures,
//! next to a plain newline scan over the same bytes as the same-run baseline; and the cost
//! per event of each wire protocol's interpreter on one 32-token answer from each API.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
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

fn per_event(c: &mut Criterion) {
    let now = Instant::now();
    let mut group = c.benchmark_group("per_event");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (api, protocol, capture) in PER_API {
        let bytes = std::fs::read(format!("{}/tests/fixtures/{capture}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let events: Vec<&[u8]> = bytes
            .split_inclusive(|b| *b == b'\n')
            .collect::<Vec<_>>()
            .chunk_by(|line, _| *line != b"\n")
            .map(|lines| {
                let start = lines[0].as_ptr() as usize - bytes.as_ptr() as usize;
                &bytes[start..start + lines.iter().map(|l| l.len()).sum::<usize>()]
            })
            .collect();
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

criterion_group!(benches, bench, per_event, interpreter);
criterion_main!(benches);
