//! One span per generation request, after the OpenTelemetry GenAI semantic conventions: named
//! `{operation} {model}`, kind server, continuing the client's trace and continued by the
//! engine's. It carries the model, operation, provider, token usage, outcome and TTFT; never a
//! prompt, a completion or any other client string.

use super::context;
use crate::record::{Engine, Operation, Outcome, RequestRecord, TraceRef};
use http::HeaderMap;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SdkTracer, Span};
use std::sync::Arc;
use std::time::SystemTime;

/// Starts the request spans (cheap to clone).
#[derive(Debug, Clone)]
pub struct RequestSpans {
    tracer: SdkTracer,
}

/// A generation request's span, ended with what the request measured.
#[derive(Debug)]
pub struct RequestSpan {
    span: Span,
    started: SystemTime,
}

impl RequestSpans {
    /// Spans from `tracer`.
    pub fn new(tracer: SdkTracer) -> Self {
        Self { tracer }
    }

    /// Starts the span of a request for `model` (its label so far: the engine may yet confirm
    /// it), as a child of the trace its headers name, and rewrites those headers so that the
    /// engine's spans become children of this one.
    pub fn start(&self, headers: &mut HeaderMap, operation: Operation, model: &str) -> RequestSpan {
        let parent = context::extract(headers);
        let started = SystemTime::now();
        let span = self
            .tracer
            .span_builder(span_name(operation, model))
            .with_kind(SpanKind::Server)
            .with_start_time(started)
            .with_attributes([KeyValue::new("gen_ai.operation.name", operation.as_str())])
            .start_with_context(&self.tracer, &parent);
        context::inject(span.span_context(), headers);
        RequestSpan { span, started }
    }
}

impl RequestSpan {
    /// The span, when it is sampled: the exemplar of the request's observations.
    pub fn trace(&self) -> Option<TraceRef> {
        TraceRef::of_sampled(self.span.span_context())
    }

    /// Ends the span with the request's measurements, its final model label and the engine.
    pub fn finish(mut self, record: &RequestRecord) {
        self.span.update_name(span_name(record.operation, &record.model));
        let mut attributes = vec![
            KeyValue::new("gen_ai.request.model", Arc::<str>::from(record.model.clone())),
            KeyValue::new("gen_ai.provider.name", Engine::label(record.provider)),
            KeyValue::new("llmslo.outcome", record.outcome.as_str()),
        ];
        if let Some(n) = record.input_tokens {
            attributes.push(KeyValue::new("gen_ai.usage.input_tokens", n as i64));
        }
        if let Some(n) = record.output_tokens {
            attributes.push(KeyValue::new("gen_ai.usage.output_tokens", n as i64));
        }
        if let Some(ttft) = record.ttft {
            attributes.push(KeyValue::new("gen_ai.server.time_to_first_token", ttft.as_secs_f64()));
            self.span
                .add_event_with_timestamp("gen_ai.first_token", self.started + ttft, Vec::new());
        }
        if let Some(answer) = record.answer_ttft {
            attributes.push(KeyValue::new("llmslo.time_to_first_answer_token", answer.as_secs_f64()));
            self.span
                .add_event_with_timestamp("llmslo.first_answer_token", self.started + answer, Vec::new());
        }
        if let Some(n) = record.reasoning_tokens {
            attributes.push(KeyValue::new("llmslo.usage.reasoning_tokens", n as i64));
        }
        if let Some(tpot) = record.tpot() {
            attributes.push(KeyValue::new("gen_ai.server.time_per_output_token", tpot.as_secs_f64()));
        }
        if let Some(basis) = record.tpot_basis {
            attributes.push(KeyValue::new("llmslo.time_per_output_token.basis", basis.as_str()));
        }
        if let Some(error) = error_type(record.outcome) {
            attributes.push(KeyValue::new("error.type", error));
            self.span.set_status(Status::error(error));
        }
        self.span.set_attributes(attributes);
        self.span.end_with_timestamp(self.started + record.e2e);
    }
}

/// `{operation} {model}`, the GenAI span name.
fn span_name(operation: Operation, model: &str) -> String {
    format!("{} {model}", operation.as_str())
}

/// The `error.type` of an outcome that is the server's failure; a client's own error, or a
/// client that left, does not fail a server span.
fn error_type(outcome: Outcome) -> Option<&'static str> {
    match outcome {
        Outcome::UpstreamError | Outcome::Timeout | Outcome::ConnectError => Some(outcome.as_str()),
        Outcome::Success | Outcome::ClientError | Outcome::ClientCancelled | Outcome::Shutdown => None,
    }
}
