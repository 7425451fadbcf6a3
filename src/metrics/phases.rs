//! The engine's own per-request phases, where its answers state them (vLLM's per-request
//! metrics): its queue, its prefill, its TTFT, the time outside it, its TPOT and how many
//! draft tokens speculative decoding got accepted.

use super::buckets::{self, BucketOverrides, Buckets};
use super::labels::RequestLabels;
use super::native::ClassicAndNative;
use crate::record::EngineTiming;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// Draft acceptance edges: tenths, and finer near the top where good speculation lives.
const ACCEPTANCE: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0];

/// Queue depth edges, requests: none waiting, then doublings.
const WAITING: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

type Phase = Family<RequestLabels, Histogram, ClassicAndNative>;

/// The phase histograms, by model, operation and provider.
#[derive(Debug, Clone)]
pub struct EnginePhases {
    queue: Phase,
    prefill: Phase,
    ttft: Phase,
    outside: Phase,
    tpot: Phase,
    acceptance: Phase,
    waiting: Phase,
}

impl EnginePhases {
    /// Empty families, with the TTFT and TPOT families' edges.
    pub fn new(b: &BucketOverrides) -> Self {
        let ttft = || Family::new_with_constructor(ClassicAndNative(Buckets::new(b.ttft.as_ref(), buckets::TTFT, &[])));
        Self {
            queue: ttft(),
            prefill: ttft(),
            ttft: ttft(),
            outside: ttft(),
            tpot: Family::new_with_constructor(ClassicAndNative(Buckets::new(b.tpot.as_ref(), buckets::TPOT, &[]))),
            acceptance: Family::new_with_constructor(ClassicAndNative(Buckets::new(None, ACCEPTANCE, &[]))),
            waiting: Family::new_with_constructor(ClassicAndNative(Buckets::new(None, WAITING, &[]))),
        }
    }

    /// Registers every family in `r`.
    pub fn register(&self, r: &mut Registry) {
        let seconds: [(&str, &str, &Phase); 5] = [
            (
                "llmslo_engine_queue_time",
                "Time the request waited in the engine's queue, as the engine states it per request",
                &self.queue,
            ),
            (
                "llmslo_engine_prefill_time",
                "Time from the engine scheduling the request to its first token (prefill, and the steps it \
                 shared), as the engine states it per request",
                &self.prefill,
            ),
            (
                "llmslo_engine_queued_to_first_token",
                "The engine's time from queueing the request to its first token (queue plus prefill): not \
                 vLLM's time_to_first_token, which counts from arrival at its API server",
                &self.ttft,
            ),
            (
                "llmslo_time_outside_engine",
                "llmslo's time to first token minus the engine's: network, HTTP, tokenisation and \
                 detokenisation (0 when the engine's figure is the larger)",
                &self.outside,
            ),
            (
                "llmslo_engine_time_per_output_token",
                "Mean time between output tokens inside the engine, as it states it per request",
                &self.tpot,
            ),
        ];
        for (name, help, family) in seconds {
            r.register_with_unit(name, help, Unit::Seconds, family.clone());
        }
        r.register(
            "llmslo_engine_draft_acceptance_ratio",
            "Share of speculative decoding's draft tokens the engine accepted, per request",
            self.acceptance.clone(),
        );
        r.register(
            "llmslo_engine_requests_waiting_at_arrival",
            "Requests waiting in the engine's queue as each request arrived, from the engine's last /metrics \
             page before it (llmslo's estimate where the engine states no per-request queue time)",
            self.waiting.clone(),
        );
    }

    /// Records the engine's queue depth as a request arrived.
    pub fn observe_waiting(&self, labels: &RequestLabels, waiting: f64) {
        self.waiting.get_or_create(labels).observe(waiting);
    }

    /// Records one request's phases; `ttft` is llmslo's own.
    pub fn observe(&self, labels: &RequestLabels, timing: EngineTiming, ttft: Option<Duration>) {
        let pairs = [
            (&self.queue, timing.queue),
            (&self.prefill, timing.prefill),
            (&self.ttft, timing.ttft()),
            (&self.tpot, timing.tpot),
            (&self.acceptance, timing.draft_acceptance),
            (&self.outside, timing.outside(ttft)),
        ];
        for (family, value) in pairs {
            if let Some(value) = value {
                family.get_or_create(labels).observe(value);
            }
        }
    }
}
