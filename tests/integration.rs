//! The integration tests, one module a subject, built as one binary: each file in this folder
//! is a module of it, so that the dependencies are linked once and the tests of every subject
//! run side by side. `cargo test --test integration sweep::` runs one subject's.

mod common;

mod accuracy;
mod adversarial;
mod agent_apis;
mod api_replay;
mod bench;
mod canary;
mod capacity;
mod causes;
mod chart_webhook;
mod cli;
mod compare;
mod cost;
mod dashboards_e2e;
mod disaggregated;
mod docs_metrics;
mod engine_metrics;
mod engines;
mod fail_open;
mod fixtures_replay;
mod framing;
mod fuzz_stream;
mod gpu;
mod hardening;
mod hygiene;
mod json_lines;
mod k8s_artifacts;
mod layering;
mod metrics_golden;
mod observe_layer;
mod otel;
mod percentiles_e2e;
mod prometheus_e2e;
mod proxy;
mod readme_commands;
mod reload;
mod remote_write_e2e;
mod rules;
mod series_budget;
mod simulate;
mod streaming;
mod sweep;
mod sweep_health;
mod tenants;
mod tls;
mod tpot_under_load;
mod webhook;
mod workload;
