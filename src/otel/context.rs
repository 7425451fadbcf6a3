//! A request's W3C trace context (`traceparent`, `tracestate`): read from the client's
//! headers, and written for the engine when llmslo's own span continues the trace.

use crate::record::TraceRef;
use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt};
use opentelemetry::Context;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The client's trace context; empty when its headers carry none (or a malformed one).
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// The sampled trace the client's headers name, if any.
pub fn client_trace(headers: &HeaderMap) -> Option<TraceRef> {
    TraceRef::of_sampled(extract(headers).span().span_context())
}

/// Replaces the trace headers with `span`'s, so the engine's spans become its children.
pub fn inject(span: &SpanContext, headers: &mut HeaderMap) {
    let cx = Context::new().with_remote_span_context(span.clone());
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use opentelemetry::trace::SpanId;

    fn headers(traceparent: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_str(traceparent).unwrap());
        headers
    }

    #[test]
    fn a_sampled_traceparent_names_the_trace() {
        let trace = client_trace(&headers("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")).unwrap();
        assert_eq!(trace.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.span_id.to_string(), "00f067aa0ba902b7");
    }

    #[test]
    fn unsampled_malformed_or_missing_context_names_nothing() {
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "not a traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(client_trace(&headers(bad)), None, "{bad}");
        }
        assert_eq!(client_trace(&HeaderMap::new()), None);
    }

    #[test]
    fn injecting_replaces_the_parent_and_keeps_the_trace() {
        let mut headers = headers("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let parent = extract(&headers).span().span_context().clone();
        let own = SpanContext::new(
            parent.trace_id(),
            SpanId::from_hex("b7ad6b7169203331").unwrap(),
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        );
        inject(&own, &mut headers);
        assert_eq!(
            headers["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
        );
    }
}
