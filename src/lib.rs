//! llmslo: a sidecar in front of LLM inference engines that measures what users feel
//! (TTFT, TPOT, inter-chunk latency, tokens) from the streamed responses and exports it to
//! Prometheus. `main.rs` is a thin CLI over this library so tests drive the whole app.

pub mod bench;
pub mod capacity;
pub mod cli;
pub mod config;
pub mod demo;
pub mod gpu;
pub mod health;
pub mod inject;
pub mod metrics;
pub mod observe;
pub mod provider;
pub mod proxy;
pub mod serve;
pub mod sidecar;
pub mod simulate;
pub mod slo;
pub mod sweep;
pub mod webhook;

pub use proxy::observe::{Observe, ObserveLayer, ObserveSettings};
