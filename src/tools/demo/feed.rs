//! The demo's subscription to the request records, as one reader: every finished request's
//! record, exact, sent to whoever listens. It never blocks the request path: a listener more
//! than [`BACKLOG`] records behind loses the oldest, and with none listening nothing is copied.

use crate::record::{Reader, RequestRecord};
use tokio::sync::broadcast;

/// Records a listener may fall behind by before it loses the oldest.
pub const BACKLOG: usize = 4096;

/// Publishes every record to its subscribers.
#[derive(Debug)]
pub struct RecordFeed(broadcast::Sender<RequestRecord>);

impl Default for RecordFeed {
    fn default() -> Self {
        Self(broadcast::channel(BACKLOG).0)
    }
}

impl RecordFeed {
    /// Every record from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RequestRecord> {
        self.0.subscribe()
    }
}

impl Reader for RecordFeed {
    fn finished(&self, record: &RequestRecord) {
        if self.0.receiver_count() > 0 {
            let _ = self.0.send(record.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Operation;
    use std::time::Duration;

    #[test]
    fn a_subscriber_gets_every_record_and_a_slow_one_loses_the_oldest() {
        let feed = RecordFeed::default();
        feed.finished(&RequestRecord::new("unheard".into(), Operation::Chat, Duration::ZERO));
        let mut records = feed.subscribe();
        for i in 0..=BACKLOG {
            feed.finished(&RequestRecord::new(
                format!("m{i}").into(),
                Operation::Chat,
                Duration::ZERO,
            ));
        }
        assert!(matches!(
            records.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(1))
        ));
        assert_eq!(
            records.try_recv().unwrap().model,
            "m1",
            "the oldest was lost, not the newest"
        );
    }
}
