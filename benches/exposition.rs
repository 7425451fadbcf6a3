//! The cost of a scrape: `/metrics` encoded for 16 models, each with every generation API
//! measured, as the OpenMetrics text a text-only scraper gets and as the protobuf (classic and
//! native buckets) a Prometheus with native histograms gets. Prints both sizes once. And the
//! cost of the engine's page: a real vLLM page and the largest page the bounds allow, read.

use criterion::{criterion_group, criterion_main, Criterion};
use llmslo::metrics::Metrics;
use llmslo::observe::recorder::RecorderSettings;
use llmslo::record::{Engine, Operation, Outcome, RequestRecord, TpotBasis};
use llmslo::{Measurement, MeasurementSettings};
use std::hint::black_box;
use std::time::Duration;

const MODELS: usize = 16;

/// A sidecar's registry after 200 requests per model and API, latencies spread over a decade.
fn busy_metrics() -> Metrics {
    let models: Vec<String> = (0..MODELS).map(|i| format!("model-{i}")).collect();
    let measurement = Measurement::new(MeasurementSettings {
        recorder: RecorderSettings {
            engine: Some(Engine::Vllm),
            models: models.clone(),
            max_models: MODELS,
            ..RecorderSettings::default()
        },
        ..MeasurementSettings::default()
    });
    for model in &models {
        for operation in [
            Operation::Chat,
            Operation::TextCompletion,
            Operation::Responses,
            Operation::Messages,
        ] {
            for i in 0..200u64 {
                let spread = 1.0 + (i % 20) as f64 / 2.0;
                measurement.recorder.finish(&RequestRecord {
                    model: model.as_str().into(),
                    operation,
                    outcome: if i % 50 == 0 {
                        Outcome::UpstreamError
                    } else {
                        Outcome::Success
                    },
                    ttft: Some(Duration::from_secs_f64(0.05 * spread)),
                    answer_ttft: Some(Duration::from_secs_f64(0.06 * spread)),
                    tpot_per_choice: vec![Duration::from_secs_f64(0.01 * spread)],
                    tpot_basis: Some(TpotBasis::Stream),
                    e2e: Duration::from_secs_f64(2.0 * spread),
                    output_tokens: Some(50 * (i % 20 + 1)),
                    input_tokens: Some(300 * (i % 20 + 1)),
                    reasoning_tokens: None,
                    token_events: 50,
                    count_source: None,
                    load: None,
                    engine: None,
                    engine_context: None,
                    trace: None,
                    provider: Some(Engine::Vllm),
                    unmeasured: None,
                    tenant: None,
                    tenant_source: None,
                    targets: Default::default(),
                    served: None,
                    ttft_parts: None,
                    relay_skipped: None,
                    leg_fields_ignored: None,
                });
            }
        }
    }
    std::sync::Arc::try_unwrap(measurement.metrics).expect("the only handle left")
}

fn exposition(c: &mut Criterion) {
    let metrics = busy_metrics();
    eprintln!("text exposition at {MODELS} models: {} bytes", metrics.encode().len());
    eprintln!(
        "protobuf exposition at {MODELS} models: {} bytes",
        metrics.encode_protobuf().len()
    );
    c.bench_function("encode_text_16_models", |b| b.iter(|| black_box(metrics.encode())));
    c.bench_function("encode_protobuf_16_models", |b| {
        b.iter(|| black_box(metrics.encode_protobuf()))
    });
}

/// A histogram page of 1,600 series of 12 samples with 150-byte label values: 3.6 MiB and
/// 19,200 samples, near both of the read's bounds.
fn largest_page() -> String {
    let pad = "p".repeat(150);
    let mut page = String::from("# TYPE vllm:worst histogram\n");
    for i in 0..1_600 {
        for le in ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "+Inf"] {
            page.push_str(&format!("vllm:worst_bucket{{s=\"{pad}-{i}\",le=\"{le}\"}} {i}\n"));
        }
        page.push_str(&format!(
            "vllm:worst_sum{{s=\"{pad}-{i}\"}} 1.5\nvllm:worst_count{{s=\"{pad}-{i}\"}} {i}\n"
        ));
    }
    page
}

fn engine_page(c: &mut Criterion) {
    use llmslo::engine::exposition::parse;
    let vllm = include_str!("../tests/fixtures/vllm-0.32-metrics.txt");
    let largest = largest_page();
    eprintln!("largest allowed engine page: {} bytes", largest.len());
    c.bench_function("engine_page_vllm", |b| {
        b.iter(|| black_box(parse(vllm, 20_000).unwrap()))
    });
    c.bench_function("engine_page_largest_allowed", |b| {
        b.iter(|| black_box(parse(&largest, 20_000).unwrap()))
    });
}

criterion_group!(benches, exposition, engine_page);
criterion_main!(benches);
