//! Throughput of the SSE parser and of parser + OpenAI interpreter on real vLLM captures,
//! next to a plain newline scan over the same bytes as the same-run baseline.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use llmslo::observe::route::Protocol;
use llmslo::observe::sse::SseParser;
use llmslo::observe::stream::StreamObserver;
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

criterion_group!(benches, bench);
criterion_main!(benches);
