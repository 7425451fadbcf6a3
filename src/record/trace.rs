//! The sampled trace a request belongs to: its exemplar.

use opentelemetry::trace::{SpanContext, SpanId, TraceId};

/// The trace and span a measurement belongs to: an exemplar's labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRef {
    /// The trace.
    pub trace_id: TraceId,
    /// The span within it: llmslo's own, or the client's when llmslo starts none.
    pub span_id: SpanId,
}

impl TraceRef {
    /// The reference of a sampled span context; an unsampled trace is kept nowhere, so an
    /// exemplar pointing at it would lead nowhere.
    pub fn of_sampled(span: &SpanContext) -> Option<TraceRef> {
        (span.is_valid() && span.is_sampled()).then(|| TraceRef {
            trace_id: span.trace_id(),
            span_id: span.span_id(),
        })
    }
}
