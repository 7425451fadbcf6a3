//! Why a request failed a latency SLO: one cause from a small fixed set, decided from the
//! engine's own account of the request (where its answer states one), the engine's
//! `/metrics` around it, and the load llmslo metered.
//!
//! TTFT (and time to first answer token), where the engine states its queue and prefill
//! times: llmslo's TTFT splits into the engine's queue, its prefill (scheduling to first
//! token) and the time outside the engine (the rest); the largest part is the cause:
//! `queueing`, `prefill` or `outside_engine`. Reasoning before the answer, when it is the
//! largest part of an answer TTFT, is `unknown`. Without the engine's account: `queueing` when
//! the engine's queue held requests as it arrived, else `unknown`.
//!
//! TPOT: `outside_engine` when the engine states a TPOT of its own within the threshold (the
//! tokens were made in time and slowed on their way); else `preemption` when the engine
//! preempted requests while it ran; else `decode_contention` when it shared the decode with at
//! least one other request on average, the engine is seen batching (its page showed two or
//! more requests running, or the fitted model's TPOT grows with the requests sharing the
//! decode) and the fit, if any, says it would have met the threshold alone; else `unknown` (on
//! an engine that does not batch, capping the batch is no cure).
//!
//! Disaggregated requests (the router named a prefill pod), where llmslo timed the parts of the
//! TTFT: the largest measured part names its pool or step: `prefill_pool` (the prefill leg),
//! `decode_queue`, `kv_transfer` (the decode engine's scheduling to first token) or
//! `outside_engine` (coordination); `unknown` when what was not measured is larger. A TPOT
//! breach of a decode pool's request that no narrower rule explains is `decode_pool`.
//!
//! End to end: whichever of the wait for the first token and the decode after it was longer
//! is judged by the rule of that phase.

use super::spec::SloKind;
use crate::record::{RequestRecord, Served, TtftPart, TtftParts};
use std::time::Duration;

/// Why a request failed a latency SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// It waited in the engine's queue: add replicas.
    Queueing,
    /// Its prefill was long (a long prompt, or prefill sharing steps): chunked prefill, a TTFT
    /// SLO per prompt length, disaggregation.
    Prefill,
    /// Its decode shared the engine with too many others: past the knee; cap the batch.
    DecodeContention,
    /// The engine preempted requests while it ran: the KV cache is too small.
    Preemption,
    /// The time went outside the engine: network, HTTP, tokenisation, a slow client.
    OutsideEngine,
    /// A disaggregated request's prefill leg was the largest part of its TTFT: the prefill
    /// pool (its queue, its prefill): scale the prefill pool.
    PrefillPool,
    /// The decode engine took longest from scheduling to the first token of a disaggregated
    /// request: pulling the KV blocks (the transfer) and the first step.
    KvTransfer,
    /// A disaggregated request waited longest in the decode engine's queue: scale the decode
    /// pool.
    DecodeQueue,
    /// A decode pool's request decoded too slowly, and nothing narrower is known: the decode
    /// pool (prefill cannot slow a decode).
    DecodePool,
    /// The evidence does not say.
    Unknown,
}

impl Cause {
    /// Every cause, in label order.
    pub const ALL: [Cause; 10] = [
        Cause::Queueing,
        Cause::Prefill,
        Cause::DecodeContention,
        Cause::Preemption,
        Cause::OutsideEngine,
        Cause::PrefillPool,
        Cause::KvTransfer,
        Cause::DecodeQueue,
        Cause::DecodePool,
        Cause::Unknown,
    ];

    /// The `cause` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Queueing => "queueing",
            Cause::Prefill => "prefill",
            Cause::DecodeContention => "decode_contention",
            Cause::Preemption => "preemption",
            Cause::OutsideEngine => "outside_engine",
            Cause::PrefillPool => "prefill_pool",
            Cause::KvTransfer => "kv_transfer",
            Cause::DecodeQueue => "decode_queue",
            Cause::DecodePool => "decode_pool",
            Cause::Unknown => "unknown",
        }
    }
}

/// What a cause was decided from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Evidence {
    /// The engine's own account of this request (vLLM's per-request metrics).
    Request,
    /// The engine's `/metrics` around the request (engine-wide).
    EngineMetrics,
    /// The load llmslo metered and its fitted model.
    Load,
    /// Nothing to decide from.
    None,
}

impl Evidence {
    /// The `evidence` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Request => "request",
            Evidence::EngineMetrics => "engine_metrics",
            Evidence::Load => "load",
            Evidence::None => "none",
        }
    }
}

/// A cause and what it was decided from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Diagnosis {
    /// The cause.
    pub cause: Cause,
    /// Its evidence.
    pub evidence: Evidence,
}

const fn diagnosis(cause: Cause, evidence: Evidence) -> Diagnosis {
    Diagnosis { cause, evidence }
}

/// Mean requests in flight over a decode from which it counts as shared.
const SHARED_DECODE: f64 = 1.5;
/// How much the fit must say sharing slowed a decode, relative to TPOT alone, for it to show
/// batching.
const BATCHING_GROWTH: f64 = 0.05;

/// The capacity model's fit of TPOT against the requests sharing the decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeFit {
    /// TPOT with one request in flight, in seconds.
    pub alone: f64,
    /// What each further request sharing the decode adds to it, in seconds.
    pub per_request: f64,
}

impl DecodeFit {
    /// Whether the engine batches as the fit sees it: a decode shared by `load` requests on
    /// average is measurably slower than one alone.
    fn shows_batching(&self, load: f64) -> bool {
        self.per_request * (load - 1.0) >= BATCHING_GROWTH * self.alone
    }
}

/// Why `record` failed the latency SLO of `kind`; `fit` is the capacity model's TPOT fit,
/// when there is one.
pub fn diagnose(kind: SloKind, record: &RequestRecord, fit: Option<DecodeFit>) -> Diagnosis {
    match kind {
        SloKind::Ttft(_) => first_token(record, record.ttft),
        SloKind::AnswerTtft(_) => first_token(record, record.answer_ttft),
        SloKind::Tpot(threshold) => decode(record, Some(threshold), fit),
        SloKind::E2e(_) => {
            let wait = record.ttft.unwrap_or(record.e2e);
            if wait >= record.e2e.saturating_sub(wait) {
                first_token(record, Some(wait))
            } else {
                decode(record, None, fit)
            }
        }
        SloKind::Availability => diagnosis(Cause::Unknown, Evidence::None),
    }
}

/// The wait for the first token (or the first answer token) that took `waited`.
fn first_token(record: &RequestRecord, waited: Option<Duration>) -> Diagnosis {
    if let (Some(parts), Some(ttft)) = (record.ttft_parts, record.ttft) {
        return disaggregated_first_token(&parts, ttft, waited.unwrap_or(ttft));
    }
    let stated = record
        .engine
        .and_then(|e| Some((e.queue?, e.prefill?, e.outside(record.ttft)?)));
    if let (Some((queue, prefill, outside)), Some(waited)) = (stated, waited) {
        let reasoning = waited.saturating_sub(record.ttft.unwrap_or(waited)).as_secs_f64();
        let parts = [
            (queue, Cause::Queueing),
            (prefill, Cause::Prefill),
            (outside, Cause::OutsideEngine),
            (reasoning, Cause::Unknown),
        ];
        let largest = parts
            .into_iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map_or(Cause::Unknown, |(_, cause)| cause);
        return diagnosis(largest, Evidence::Request);
    }
    match record.engine_context.and_then(|c| c.waiting_at_arrival) {
        Some(waiting) if waiting > 0.0 => diagnosis(Cause::Queueing, Evidence::EngineMetrics),
        Some(_) => diagnosis(Cause::Unknown, Evidence::EngineMetrics),
        None => diagnosis(Cause::Unknown, Evidence::None),
    }
}

/// A disaggregated request's wait for its first token (or its first answer token, `waited`):
/// the largest of its measured parts names the pool or step that caused it; when what was not
/// measured (or reasoning after the first token) is larger than every measured part, the cause
/// is `unknown`.
fn disaggregated_first_token(parts: &TtftParts, ttft: Duration, waited: Duration) -> Diagnosis {
    let measured: f64 = parts.each().iter().filter_map(|(_, v)| *v).sum();
    let unmeasured = (ttft.as_secs_f64() - measured).max(0.0);
    let reasoning = waited.saturating_sub(ttft).as_secs_f64();
    let cause_of = |part| match part {
        TtftPart::Prefill => Cause::PrefillPool,
        TtftPart::DecodeQueue => Cause::DecodeQueue,
        TtftPart::KvTransfer => Cause::KvTransfer,
        TtftPart::Coordination => Cause::OutsideEngine,
    };
    let largest = parts
        .each()
        .into_iter()
        .filter_map(|(part, v)| Some((v?, cause_of(part))))
        .chain([(unmeasured, Cause::Unknown), (reasoning, Cause::Unknown)])
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(Cause::Unknown, |(_, cause)| cause);
    diagnosis(largest, Evidence::Request)
}

/// The decode, judged against a TPOT `threshold` when the SLO has one: on a decode pool's
/// request, what no narrower rule names is the decode pool's.
fn decode(record: &RequestRecord, threshold: Option<Duration>, fit: Option<DecodeFit>) -> Diagnosis {
    let found = engine_decode(record, threshold, fit);
    let decode_pool = matches!(record.served, Some(Served::Disaggregated | Served::DecodeOnly));
    if decode_pool && found.cause == Cause::Unknown {
        return diagnosis(Cause::DecodePool, found.evidence);
    }
    found
}

/// The decode of one engine, judged against a TPOT `threshold` when the SLO has one.
fn engine_decode(record: &RequestRecord, threshold: Option<Duration>, fit: Option<DecodeFit>) -> Diagnosis {
    let engine_tpot = record.engine.and_then(|e| e.tpot);
    let made_in_time = match (engine_tpot, threshold, record.tpot()) {
        (Some(engine), Some(threshold), _) => engine <= threshold.as_secs_f64(),
        // End to end: the engine made the tokens in under half the time llmslo saw them take.
        (Some(engine), None, Some(seen)) => engine < 0.5 * seen.as_secs_f64(),
        _ => false,
    };
    if made_in_time {
        return diagnosis(Cause::OutsideEngine, Evidence::Request);
    }
    if record.engine_context.is_some_and(|c| c.preemptions_during) {
        return diagnosis(Cause::Preemption, Evidence::EngineMetrics);
    }
    if let Some(load) = record.load.and_then(|l| l.decode).filter(|&l| l >= SHARED_DECODE) {
        let batch_on_page = record.engine_context.and_then(|c| c.running).is_some_and(|r| r >= 2.0);
        let alone_in_time = match (fit, threshold) {
            (Some(fit), Some(threshold)) => fit.alone <= threshold.as_secs_f64(),
            _ => true,
        };
        if alone_in_time && batch_on_page {
            return diagnosis(Cause::DecodeContention, Evidence::EngineMetrics);
        }
        if alone_in_time && fit.is_some_and(|fit| fit.shows_batching(load)) {
            return diagnosis(Cause::DecodeContention, Evidence::Load);
        }
    }
    let evidence = match (engine_tpot, record.load) {
        (Some(_), _) => Evidence::Request,
        (None, Some(_)) => Evidence::Load,
        (None, None) => Evidence::None,
    };
    diagnosis(Cause::Unknown, evidence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::EngineContext;
    use crate::record::EngineTiming;
    use crate::record::Operation;
    use crate::record::RequestLoad;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn record(ttft: u64, tpot: u64, e2e: u64) -> RequestRecord {
        let mut r = RequestRecord::new("m".into(), Operation::Chat, ms(e2e));
        r.ttft = Some(ms(ttft));
        r.tpot_per_choice = vec![ms(tpot)];
        r
    }

    fn timing(queue: f64, prefill: f64, tpot: f64) -> Option<EngineTiming> {
        Some(EngineTiming {
            queue: Some(queue),
            prefill: Some(prefill),
            tpot: Some(tpot),
            ..EngineTiming::default()
        })
    }

    fn load(decode: f64) -> Option<RequestLoad> {
        Some(RequestLoad {
            arrival: decode,
            decode: Some(decode),
            whole: Some(decode),
            decode_arrivals: Some(1.0),
        })
    }

    const TTFT: SloKind = SloKind::Ttft(Duration::from_millis(500));
    const TPOT: SloKind = SloKind::Tpot(Duration::from_millis(50));

    #[test]
    fn the_largest_part_of_a_stated_ttft_is_its_cause() {
        let mut r = record(900, 20, 2000);
        r.engine = timing(0.7, 0.15, 0.02);
        assert_eq!(diagnose(TTFT, &r, None), diagnosis(Cause::Queueing, Evidence::Request));
        r.engine = timing(0.01, 0.8, 0.02);
        assert_eq!(diagnose(TTFT, &r, None).cause, Cause::Prefill);
        r.engine = timing(0.01, 0.1, 0.02);
        assert_eq!(diagnose(TTFT, &r, None).cause, Cause::OutsideEngine, "790 ms outside");
        r.answer_ttft = Some(ms(5000));
        assert_eq!(
            diagnose(SloKind::AnswerTtft(ms(1000)), &r, None).cause,
            Cause::Unknown,
            "reasoning"
        );
    }

    #[test]
    fn without_the_engines_account_the_queue_at_arrival_decides() {
        let mut r = record(900, 20, 2000);
        assert_eq!(diagnose(TTFT, &r, None), diagnosis(Cause::Unknown, Evidence::None));
        r.engine_context = Some(EngineContext {
            waiting_at_arrival: Some(3.0),
            preemptions_during: false,
            running: None,
        });
        assert_eq!(
            diagnose(TTFT, &r, None),
            diagnosis(Cause::Queueing, Evidence::EngineMetrics)
        );
        r.engine_context = Some(EngineContext::default());
        assert_eq!(diagnose(TTFT, &r, None), diagnosis(Cause::Unknown, Evidence::None));
    }

    #[test]
    fn a_slow_decode_is_outside_preempted_contended_or_unknown() {
        let mut r = record(100, 80, 2000);
        r.engine = timing(0.0, 0.05, 0.03);
        assert_eq!(
            diagnose(TPOT, &r, None),
            diagnosis(Cause::OutsideEngine, Evidence::Request)
        );
        r.engine = timing(0.0, 0.05, 0.08);
        r.load = load(30.0);
        r.engine_context = Some(EngineContext {
            waiting_at_arrival: Some(0.0),
            preemptions_during: true,
            running: None,
        });
        let batching = |alone| {
            Some(DecodeFit {
                alone,
                per_request: 0.002,
            })
        };
        assert_eq!(diagnose(TPOT, &r, batching(0.02)).cause, Cause::Preemption);
        r.engine_context = None;
        assert_eq!(
            diagnose(TPOT, &r, batching(0.02)),
            diagnosis(Cause::DecodeContention, Evidence::Load)
        );
        assert_eq!(
            diagnose(TPOT, &r, batching(0.07)).cause,
            Cause::Unknown,
            "too slow even alone"
        );
        // An engine whose TPOT does not grow with the requests sharing it does not batch:
        // capping the batch would cure nothing. Nor is there evidence before a fit.
        let flat = Some(DecodeFit {
            alone: 0.02,
            per_request: 0.0,
        });
        assert_eq!(diagnose(TPOT, &r, flat), diagnosis(Cause::Unknown, Evidence::Request));
        assert_eq!(diagnose(TPOT, &r, None).cause, Cause::Unknown);
        // The engine's own page showing a batch is evidence enough, before any fit.
        r.engine_context = Some(EngineContext {
            running: Some(12.0),
            ..EngineContext::default()
        });
        assert_eq!(
            diagnose(TPOT, &r, None),
            diagnosis(Cause::DecodeContention, Evidence::EngineMetrics)
        );
        r.engine_context = Some(EngineContext {
            running: Some(1.0),
            ..EngineContext::default()
        });
        assert_eq!(
            diagnose(TPOT, &r, None).cause,
            Cause::Unknown,
            "one at a time: no batch"
        );
        r.engine_context = None;
        r.load = load(1.0);
        assert_eq!(
            diagnose(TPOT, &r, batching(0.02)).cause,
            Cause::Unknown,
            "it had the engine to itself"
        );
    }

    #[test]
    fn a_disaggregated_breach_is_charged_to_the_part_that_took_longest() {
        let split = |prefill: Option<u64>, queue: f64, kv: f64| {
            let mut r = record(1000, 20, 3000);
            r.served = Some(Served::Disaggregated);
            r.engine = timing(queue, kv, 0.02);
            r.ttft_parts = Some(TtftParts::split(ms(1000), prefill.map(ms), r.engine));
            r
        };
        let cause = |r: &RequestRecord| diagnose(TTFT, r, None);
        assert_eq!(
            cause(&split(Some(800), 0.05, 0.05)),
            diagnosis(Cause::PrefillPool, Evidence::Request)
        );
        assert_eq!(cause(&split(Some(100), 0.7, 0.05)).cause, Cause::DecodeQueue);
        assert_eq!(cause(&split(Some(100), 0.05, 0.7)).cause, Cause::KvTransfer);
        assert_eq!(
            cause(&split(Some(100), 0.05, 0.05)).cause,
            Cause::OutsideEngine,
            "800 ms coordinating"
        );
        // The prefill leg not relayed: 900 ms unmeasured outweigh the decode engine's parts.
        assert_eq!(cause(&split(None, 0.05, 0.05)).cause, Cause::Unknown);
        assert_eq!(cause(&split(None, 0.6, 0.05)).cause, Cause::DecodeQueue);
    }

    #[test]
    fn a_decode_pools_slow_decode_is_the_decode_pools() {
        let mut r = record(100, 80, 2000);
        assert_eq!(
            diagnose(TPOT, &r, None).cause,
            Cause::Unknown,
            "an aggregated engine: unknown"
        );
        for served in [Served::Disaggregated, Served::DecodeOnly] {
            r.served = Some(served);
            assert_eq!(diagnose(TPOT, &r, None).cause, Cause::DecodePool);
        }
        r.engine = timing(0.0, 0.05, 0.03);
        assert_eq!(
            diagnose(TPOT, &r, None).cause,
            Cause::OutsideEngine,
            "made in time, slowed on the way"
        );
        r.served = Some(Served::Aggregated);
        r.engine = None;
        assert_eq!(diagnose(TPOT, &r, None).cause, Cause::Unknown);
    }

    #[test]
    fn end_to_end_is_judged_by_its_longer_phase() {
        let mut r = record(1500, 20, 2000);
        r.engine = timing(1.4, 0.05, 0.02);
        assert_eq!(diagnose(SloKind::E2e(ms(1000)), &r, None).cause, Cause::Queueing);
        let mut r = record(100, 60, 6000);
        r.load = load(20.0);
        let fit = Some(DecodeFit {
            alone: 0.02,
            per_request: 0.002,
        });
        assert_eq!(diagnose(SloKind::E2e(ms(1000)), &r, fit).cause, Cause::DecodeContention);
        r.engine = timing(0.0, 0.05, 0.01);
        assert_eq!(diagnose(SloKind::E2e(ms(1000)), &r, None).cause, Cause::OutsideEngine);
    }
}
