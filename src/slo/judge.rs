//! How one request stands against one SLO, and whether it counts as goodput: judged at full
//! precision from its record, never from histogram buckets.

use super::spec::{Slo, SloKind, SloSet};
use crate::record::{Outcome, RequestRecord};
use std::time::Duration;

/// How one request stands against one SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not a valid event for this SLO (client's doing, or nothing to judge).
    NotCounted,
    /// A good event.
    Good,
    /// A bad event.
    Bad,
}

/// Classifies `record` against `slo`, at full precision (not from histogram buckets).
pub fn classify(slo: &Slo, record: &RequestRecord) -> Verdict {
    let within = |value: Option<Duration>, threshold: Duration| match value {
        Some(value) if record.outcome == Outcome::Success => {
            if value <= threshold {
                Verdict::Good
            } else {
                Verdict::Bad
            }
        }
        _ => Verdict::NotCounted,
    };
    match slo.kind {
        SloKind::Availability => match record.outcome {
            Outcome::Success => Verdict::Good,
            Outcome::UpstreamError | Outcome::Timeout | Outcome::ConnectError => Verdict::Bad,
            Outcome::ClientError | Outcome::ClientCancelled | Outcome::Shutdown => Verdict::NotCounted,
        },
        SloKind::Ttft(_) | SloKind::AnswerTtft(_) if !slo.prompt.judges(record.input_tokens) => Verdict::NotCounted,
        SloKind::Ttft(threshold) => within(record.ttft, slo.prompt.threshold(threshold, record.input_tokens)),
        SloKind::AnswerTtft(threshold) => {
            within(record.answer_ttft, slo.prompt.threshold(threshold, record.input_tokens))
        }
        SloKind::Tpot(threshold) => within(record.tpot(), threshold),
        SloKind::E2e(threshold) => within(Some(record.e2e), threshold),
    }
}

/// Whether `record` counts as goodput: it succeeded and no SLO that decides goodput
/// ([`SloSet::decides_goodput`]) judged it bad (`verdicts` holds its verdict for each SLO of
/// `set`, in order). A request whose own latency targets are trusted is judged by them
/// instead: it succeeded and met every target it states. Targets not trusted change nothing
/// here ([`met_own_targets`] judges them apart).
pub fn is_goodput(set: &SloSet, record: &RequestRecord, verdicts: &[Verdict]) -> bool {
    let targets = &record.targets;
    if targets.any() && targets.trusted {
        return met_own_targets(record);
    }
    record.outcome == Outcome::Success
        && verdicts
            .iter()
            .enumerate()
            .all(|(i, verdict)| *verdict != Verdict::Bad || !set.decides_goodput(i))
}

/// Whether `record` succeeded and met every latency target it stated itself.
pub fn met_own_targets(record: &RequestRecord) -> bool {
    record.outcome == Outcome::Success && record.targets.met_by(record)
}
