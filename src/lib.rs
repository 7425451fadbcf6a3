#![recursion_limit = "256"]
//! llmslo: a sidecar in front of LLM inference engines that measures what users feel
//! (TTFT, TPOT, inter-chunk latency, tokens) from the streamed responses and exports it to
//! Prometheus. `main.rs` is a thin CLI over this library so tests drive the whole app.
//!
//! The layout follows the data path:
//! - the runtime: [`config`], [`sidecar`] (the assembly), [`serve`] (the accept loop),
//!   [`health`], [`provider`];
//! - the request path: [`proxy`] (tower layers: guard, observe, timeout, forward), [`observe`]
//!   (stream parsing and the per-request record), then what records go into: [`metrics`],
//!   [`slo`], [`capacity`], and [`otel`] (trace context, spans, OTLP export); beside them
//!   [`gpu`];
//! - [`body`]: the body types and errors every layer shares ([`BoxBody`], [`BoxError`]);
//! - [`k8s`]: the injector and the admission webhook; [`tools`]: demo, simulated engine,
//!   sweep, bench; [`cli`]: the subcommands.

pub mod body;
pub mod capacity;
pub mod cli;
pub mod config;
pub mod cost;
pub mod engine;
pub mod fingerprint;
pub mod flags;
pub mod gpu;
pub mod health;
pub mod k8s;
pub mod metrics;
pub mod observe;
pub mod otel;
pub mod own_wake;
pub mod proto;
pub mod provider;
pub mod proxy;
pub mod quantile;
pub mod record;
pub mod serve;
pub mod sidecar;
pub mod slo;
pub mod tenant;
pub mod tools;
pub mod upstream;
pub mod window;
pub mod workload;

pub use body::{BoxBody, BoxError};
pub use proxy::observe::{Observe, ObserveLayer, ObserveSettings};
pub use sidecar::measurement::{Measurement, MeasurementSettings};
