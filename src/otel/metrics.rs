//! The request-level families as OpenTelemetry instruments, with the GenAI names and
//! attributes (`gen_ai.server.time_to_first_token`, …, `gen_ai.request.model`), plus llmslo's
//! own counters; the same buckets as on `/metrics`. Recorded once per finished request.

use crate::record::{Engine, LabelText, Ongoing, Operation, Outcome, Reader, RequestRecord, Started};
use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::KeyValue;
use std::sync::Arc;

/// Bucket edges of the exported histograms, the same as the Prometheus families'.
#[derive(Debug, Clone)]
pub struct Boundaries {
    /// TTFT, seconds.
    pub ttft: Vec<f64>,
    /// Time to first answer token, seconds.
    pub answer_ttft: Vec<f64>,
    /// TPOT, seconds.
    pub tpot: Vec<f64>,
    /// End-to-end duration, seconds.
    pub e2e: Vec<f64>,
    /// Token usage, tokens.
    pub tokens: Vec<f64>,
    /// Inter-chunk latency, seconds.
    pub inter_chunk: Vec<f64>,
    /// Tokens per chunk.
    pub tokens_per_chunk: Vec<f64>,
    /// The engine's per-request phases (queue, prefill, its TTFT, the time outside it),
    /// seconds.
    pub phases: Vec<f64>,
    /// The engine's per-request TPOT, seconds.
    pub engine_tpot: Vec<f64>,
}

/// The instruments one meter records requests into.
#[derive(Debug, Clone)]
pub struct OtelMetrics {
    ttft: Histogram<f64>,
    answer_ttft: Histogram<f64>,
    tpot: Histogram<f64>,
    duration: Histogram<f64>,
    token_usage: Histogram<u64>,
    inter_chunk: Histogram<f64>,
    tokens_per_chunk: Histogram<f64>,
    requests: Counter<u64>,
    output_tokens: Counter<u64>,
    input_tokens: Counter<u64>,
    reasoning_tokens: Counter<u64>,
    engine: EnginePhaseInstruments,
}

/// The engine's per-request phases, where its answers state them.
#[derive(Debug, Clone)]
struct EnginePhaseInstruments {
    queue: Histogram<f64>,
    prefill: Histogram<f64>,
    ttft: Histogram<f64>,
    outside: Histogram<f64>,
    tpot: Histogram<f64>,
    draft_acceptance: Histogram<f64>,
    waiting_at_arrival: Histogram<f64>,
}

impl EnginePhaseInstruments {
    fn new(meter: &Meter, phases: &[f64], tpot: Vec<f64>) -> Self {
        let seconds = |name: &'static str, description: &'static str, boundaries: Vec<f64>| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(description)
                .with_boundaries(boundaries)
                .build()
        };
        Self {
            queue: seconds(
                "llmslo.engine.queue_time",
                "Time in the engine's queue, as the engine states it per request",
                phases.to_vec(),
            ),
            prefill: seconds(
                "llmslo.engine.prefill_time",
                "From the engine scheduling the request to its first token, as the engine states it",
                phases.to_vec(),
            ),
            ttft: seconds(
                "llmslo.engine.time_to_first_token",
                "The engine's own time to first token: its queue plus its prefill",
                phases.to_vec(),
            ),
            outside: seconds(
                "llmslo.time_outside_engine",
                "llmslo's time to first token minus the engine's",
                phases.to_vec(),
            ),
            tpot: seconds(
                "llmslo.engine.time_per_output_token",
                "Mean time between output tokens inside the engine",
                tpot,
            ),
            draft_acceptance: meter
                .f64_histogram("llmslo.engine.draft_acceptance_ratio")
                .with_unit("1")
                .with_description("Share of speculative decoding's draft tokens the engine accepted")
                .build(),
            waiting_at_arrival: meter
                .f64_histogram("llmslo.engine.requests_waiting_at_arrival")
                .with_unit("{request}")
                .with_description("Requests waiting in the engine's queue as the request arrived")
                .build(),
        }
    }

    fn record(&self, record: &RequestRecord, attributes: &[KeyValue]) {
        if let Some(timing) = record.engine {
            let values = [
                (&self.queue, timing.queue),
                (&self.prefill, timing.prefill),
                (&self.ttft, timing.ttft()),
                (&self.outside, timing.outside(record.ttft)),
                (&self.tpot, timing.tpot),
                (&self.draft_acceptance, timing.draft_acceptance),
            ];
            for (histogram, value) in values {
                if let Some(value) = value {
                    histogram.record(value, attributes);
                }
            }
        }
        if let Some(waiting) = record.engine_context.and_then(|c| c.waiting_at_arrival) {
            self.waiting_at_arrival.record(waiting, attributes);
        }
    }
}

impl OtelMetrics {
    /// Creates the instruments on `meter`.
    pub fn new(meter: &Meter, boundaries: Boundaries) -> Self {
        Self {
            ttft: meter
                .f64_histogram("gen_ai.server.time_to_first_token")
                .with_unit("s")
                .with_description("Time to generate the first token of a response")
                .with_boundaries(boundaries.ttft)
                .build(),
            answer_ttft: meter
                .f64_histogram("llmslo.time_to_first_answer_token")
                .with_unit("s")
                .with_description("Time to the first token of the answer itself, after any reasoning")
                .with_boundaries(boundaries.answer_ttft)
                .build(),
            tpot: meter
                .f64_histogram("gen_ai.server.time_per_output_token")
                .with_unit("s")
                .with_description("Time per output token after the first")
                .with_boundaries(boundaries.tpot)
                .build(),
            duration: meter
                .f64_histogram("gen_ai.server.request.duration")
                .with_unit("s")
                .with_description("Generation request duration, head to end of response")
                .with_boundaries(boundaries.e2e)
                .build(),
            token_usage: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Input and output tokens per request")
                .with_boundaries(boundaries.tokens)
                .build(),
            inter_chunk: meter
                .f64_histogram("llmslo.inter_chunk_latency")
                .with_unit("s")
                .with_description("Time between consecutive token-carrying stream events")
                .with_boundaries(boundaries.inter_chunk)
                .build(),
            tokens_per_chunk: meter
                .f64_histogram("llmslo.tokens_per_chunk")
                .with_unit("{token}")
                .with_description("Mean output tokens per token-carrying event, per request")
                .with_boundaries(boundaries.tokens_per_chunk)
                .build(),
            requests: meter
                .u64_counter("llmslo.requests")
                .with_unit("{request}")
                .with_description("Generation requests by outcome")
                .build(),
            output_tokens: meter
                .u64_counter("llmslo.output_tokens")
                .with_unit("{token}")
                .with_description("Output tokens generated")
                .build(),
            input_tokens: meter
                .u64_counter("llmslo.input_tokens")
                .with_unit("{token}")
                .with_description("Input tokens read")
                .build(),
            reasoning_tokens: meter
                .u64_counter("llmslo.reasoning_tokens")
                .with_unit("{token}")
                .with_description("Output tokens spent on reasoning, where the usage reports them")
                .build(),
            engine: EnginePhaseInstruments::new(meter, &boundaries.phases, boundaries.engine_tpot),
        }
    }
}

impl Reader for OtelMetrics {
    /// One request's inter-chunk gaps go to the instrument, with its attributes made once.
    fn started(&self, request: &Started<'_>) -> Option<Arc<dyn Ongoing>> {
        Some(Arc::new(OtlpGaps {
            histogram: self.inter_chunk.clone(),
            attributes: common_attributes(request.model, request.operation, Engine::label(request.provider)).into(),
        }))
    }

    fn finished(&self, record: &RequestRecord) {
        let common = common_attributes(&record.model, record.operation, Engine::label(record.provider));
        if let Some(mean) = record.tokens_per_chunk() {
            self.tokens_per_chunk.record(mean, &common);
        }
        if let Some(ttft) = record.ttft {
            self.ttft.record(ttft.as_secs_f64(), &common);
        }
        if let Some(answer) = record.answer_ttft {
            self.answer_ttft.record(answer.as_secs_f64(), &common);
        }
        if let Some(n) = record.reasoning_tokens {
            self.reasoning_tokens.add(n, &common);
        }
        for tpot in &record.tpot_per_choice {
            self.tpot.record(tpot.as_secs_f64(), &common);
        }
        self.engine.record(record, &common);
        let mut with_outcome = common.to_vec();
        with_outcome.push(KeyValue::new("llmslo.outcome", record.outcome.as_str()));
        if record.outcome != Outcome::Success {
            with_outcome.push(KeyValue::new("error.type", record.outcome.as_str()));
        }
        self.duration.record(record.e2e.as_secs_f64(), &with_outcome);
        self.requests.add(1, &with_outcome);
        for (count, token_type, total) in [
            (record.input_tokens, "input", &self.input_tokens),
            (record.output_tokens, "output", &self.output_tokens),
        ] {
            if let Some(n) = count {
                total.add(n, &common);
                let mut attributes = common.to_vec();
                attributes.push(KeyValue::new("gen_ai.token.type", token_type));
                self.token_usage.record(n, &attributes);
            }
        }
    }
}

/// One request's inter-chunk latency instrument and attributes.
#[derive(Debug)]
struct OtlpGaps {
    histogram: Histogram<f64>,
    attributes: Arc<[KeyValue]>,
}

impl Ongoing for OtlpGaps {
    fn gap(&self, seconds: f64) {
        self.histogram.record(seconds, &self.attributes);
    }
}

/// `gen_ai.request.model`, `gen_ai.operation.name`, `gen_ai.provider.name`.
fn common_attributes(model: &LabelText, operation: Operation, provider: &'static str) -> [KeyValue; 3] {
    [
        KeyValue::new("gen_ai.request.model", Arc::<str>::from(model.clone())),
        KeyValue::new("gen_ai.operation.name", operation.as_str()),
        KeyValue::new("gen_ai.provider.name", provider),
    ]
}
