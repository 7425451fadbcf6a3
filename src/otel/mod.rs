//! OpenTelemetry: the W3C trace context of each request (for exemplars and spans), the GenAI
//! span per generation request, and OTLP export of spans and metrics.

pub mod context;
pub mod export;
pub mod metrics;
pub mod settings;
pub mod spans;
