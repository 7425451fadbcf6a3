//! The sidecar's exact figures of the requests that finished, gathered from the demo's feed
//! of request records: the table's percentiles are read from them, not from buckets.

use crate::quantile::nearest_rank;
use crate::record::RequestRecord;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The sidecar's exact figures (seconds) of the requests that finished over some span: per
/// model TTFT and TPOT, per API TTFT and time to the first answer token. Each list keeps its
/// latest [`Exact::KEEP`] values, so a days-long demo stays small.
#[derive(Debug, Default)]
pub(super) struct Exact {
    pub(super) by_model: BTreeMap<String, [VecDeque<f64>; 2]>,
    pub(super) by_api: BTreeMap<&'static str, [VecDeque<f64>; 2]>,
    /// Records the demo fell too far behind to read.
    pub(super) lost: u64,
}

impl Exact {
    pub(super) const KEEP: usize = 100_000;

    pub(super) fn add(&mut self, record: &RequestRecord) {
        let push = |list: &mut VecDeque<f64>, value: Option<Duration>| {
            if let Some(value) = value {
                if list.len() == Self::KEEP {
                    list.pop_front();
                }
                list.push_back(value.as_secs_f64());
            }
        };
        let [ttft, tpot] = self.by_model.entry(record.model.to_string()).or_default();
        push(ttft, record.ttft);
        for choice in &record.tpot_per_choice {
            push(tpot, Some(*choice));
        }
        let [api_ttft, answer] = self.by_api.entry(record.operation.as_str()).or_default();
        push(api_ttft, record.ttft);
        push(answer, record.answer_ttft);
    }
}

/// Reads every record the sidecar publishes into each of `spans` until the sidecar stops.
pub(super) async fn gather_records(
    mut records: tokio::sync::broadcast::Receiver<RequestRecord>,
    spans: [Arc<Mutex<Exact>>; 2],
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match records.recv().await {
            Ok(record) => spans
                .iter()
                .for_each(|s| s.lock().expect("demo records lock").add(&record)),
            Err(RecvError::Lagged(n)) => spans
                .iter()
                .for_each(|s| s.lock().expect("demo records lock").lost += n),
            Err(RecvError::Closed) => return,
        }
    }
}

/// The nearest-rank `q` quantile of `values`: a value the sidecar measured.
pub(super) fn exact_quantile(values: Option<&VecDeque<f64>>, q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values?.iter().copied().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    Some(nearest_rank(&sorted, q))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Operation;

    #[test]
    fn the_kept_figures_are_bounded() {
        let mut exact = Exact::default();
        let record = RequestRecord {
            ttft: Some(Duration::from_millis(1)),
            tpot_per_choice: vec![Duration::from_millis(1)],
            ..RequestRecord::new("m".into(), Operation::Chat, Duration::from_secs(1))
        };
        for _ in 0..Exact::KEEP + 10 {
            exact.add(&record);
        }
        assert!(exact.by_model["m"].iter().all(|l| l.len() == Exact::KEEP));
    }
}
