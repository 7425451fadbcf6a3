//! The sidecar's rolling record of recent generation requests: when each arrived, its API,
//! model and token counts, and whether it streamed; never a prompt or an answer. It keeps the
//! last `capacity` requests (about [`BYTES_PER_REQUEST`] bytes each) and serves them as a
//! Mooncake-style trace on the metrics port's `/workload`, written as it is sent: at most
//! [`MAX_PAGES_AT_ONCE`] pages at a time, each holding a copy of the rows and one frame.

use super::trace::{Trace, TraceRow};
use crate::record::{LabelText, Operation, Reader, RequestRecord};
use bytes::Bytes;
use hyper::body::{Body, Frame};
use serde::Serialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Most requests the record may be asked to keep.
pub const MAX_RECENT_REQUESTS: usize = 1_000_000;
/// What one kept request costs in memory, in bytes (the model name is shared).
pub const BYTES_PER_REQUEST: usize = std::mem::size_of::<Kept>();
/// Most `/workload` pages written at once: each holds a copy of the rows while it is sent. One
/// more is answered 503 at once.
pub const MAX_PAGES_AT_ONCE: usize = 2;
/// Rows written into one frame of a page.
const ROWS_PER_FRAME: usize = 512;
/// Most one frame of a page holds: its rows' lines, each at most a model name (128 bytes) and
/// its figures.
pub const PAGE_FRAME_BYTES: usize = ROWS_PER_FRAME * 256;

/// One request as kept.
#[derive(Debug, Clone)]
struct Kept {
    /// Arrival, in microseconds since the record began.
    arrival_us: u64,
    input: u32,
    output: u32,
    reasoning: Option<u32>,
    api: &'static str,
    /// The record's own label value, shared with every other request of the model.
    model: LabelText,
    stream: bool,
}

/// The rolling record; a [`Reader`] of the sidecar.
#[derive(Debug)]
pub struct RecentRequests {
    began: Instant,
    capacity: usize,
    kept: Mutex<VecDeque<Kept>>,
    /// The pages being written.
    pages: Arc<Semaphore>,
}

impl RecentRequests {
    /// A record of the last `capacity` generation requests (at most [`MAX_RECENT_REQUESTS`]).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.min(MAX_RECENT_REQUESTS);
        Self {
            began: Instant::now(),
            capacity,
            kept: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            pages: Arc::new(Semaphore::new(MAX_PAGES_AT_ONCE)),
        }
    }

    /// The kept requests as a trace, first arrival at 0 ms.
    pub fn trace(&self) -> Trace {
        let rows = self.sorted_rows();
        let first = rows.first().map_or(0, |k| k.arrival_us);
        Trace {
            rows: rows
                .iter()
                .map(|k| TraceRow {
                    timestamp: k.offset_ms(first),
                    api: Some(k.api.to_string()),
                    model: Some(k.model.to_string()),
                    reasoning_length: k.reasoning,
                    stream: Some(k.stream),
                    ..TraceRow::lengths(k.input, k.output)
                })
                .collect(),
        }
    }

    /// The kept requests as a JSONL page written frame by frame as the client takes it (the
    /// same lines as the trace's); `None` while [`MAX_PAGES_AT_ONCE`] pages are being written.
    /// The rows are copied and sorted on a blocking thread, never on one that serves traffic.
    pub async fn page(self: &Arc<Self>) -> Option<WorkloadPage> {
        let permit = self.pages.clone().try_acquire_owned().ok()?;
        let recent = self.clone();
        let rows = tokio::task::spawn_blocking(move || recent.sorted_rows()).await.ok()?;
        let first = rows.first().map_or(0, |k| k.arrival_us);
        Some(WorkloadPage {
            rows: rows.into_iter(),
            first,
            _permit: permit,
        })
    }

    /// A copy of the kept rows, in arrival order. The lock is held only to copy them: requests
    /// that end meanwhile wait for a copy, never for a page.
    fn sorted_rows(&self) -> Vec<Kept> {
        let mut rows: Vec<Kept> = {
            let recent = self.kept.lock().expect("recent requests lock");
            recent.iter().cloned().collect()
        };
        rows.sort_by_key(|k| k.arrival_us);
        rows
    }
}

impl Kept {
    /// Its arrival in whole milliseconds after the first's, at `first` microseconds.
    fn offset_ms(&self, first: u64) -> u64 {
        (self.arrival_us - first + 500) / 1000
    }
}

/// A `/workload` page being sent: the rows not yet written, holding its place among the pages
/// written at once.
pub struct WorkloadPage {
    rows: std::vec::IntoIter<Kept>,
    first: u64,
    _permit: OwnedSemaphorePermit,
}

/// One line of the page, as [`TraceRow`] writes it, borrowing its strings.
#[derive(Serialize)]
struct Line<'a> {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    api: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_length: Option<u32>,
    stream: bool,
}

impl Body for WorkloadPage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let first = self.first;
        let mut frame = Vec::with_capacity(ROWS_PER_FRAME * 128);
        for kept in self.rows.by_ref().take(ROWS_PER_FRAME) {
            let line = Line {
                timestamp: kept.offset_ms(first),
                input_length: kept.input,
                output_length: kept.output,
                api: kept.api,
                model: &kept.model,
                reasoning_length: kept.reasoning,
                stream: kept.stream,
            };
            serde_json::to_writer(&mut frame, &line).expect("a line serializes");
            frame.push(b'\n');
        }
        Poll::Ready((!frame.is_empty()).then(|| Ok(Frame::data(Bytes::from(frame)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rows.len() == 0
    }
}

impl Reader for RecentRequests {
    fn finished(&self, record: &RequestRecord) {
        let Some(api) = api_name(record.operation) else { return };
        // A request whose lengths are unknown cannot be replayed; one that produced nothing is
        // not a generation to replay either.
        let (Some(input), Some(output)) = (record.input_tokens, record.output_tokens) else {
            return;
        };
        if output == 0 || self.capacity == 0 {
            return;
        }
        let arrival = Instant::now().checked_sub(record.e2e).unwrap_or(self.began);
        let arrival_us = arrival.saturating_duration_since(self.began).as_micros() as u64;
        let clamp = |n: u64| n.min(u64::from(super::trace::MAX_LENGTH)) as u32;
        let mut recent = self.kept.lock().expect("recent requests lock");
        if recent.len() == self.capacity {
            recent.pop_front();
        }
        recent.push_back(Kept {
            arrival_us,
            input: clamp(input),
            output: clamp(output),
            reasoning: record.reasoning_tokens.map(clamp),
            api,
            model: record.model.clone(),
            stream: record.count_source.is_some(),
        });
    }
}

/// The `api` a trace names an operation by, for the generation APIs a sweep can replay.
pub fn api_name(operation: Operation) -> Option<&'static str> {
    match operation {
        Operation::Chat => Some("chat"),
        Operation::TextCompletion => Some("completions"),
        Operation::Responses => Some("responses"),
        Operation::Messages => Some("messages"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::CountSource;
    use std::time::Duration;

    fn record(model: &LabelText, operation: Operation, e2e_ms: u64, input: u64, output: u64) -> RequestRecord {
        let mut record = RequestRecord::new(model.clone(), operation, Duration::from_millis(e2e_ms));
        record.input_tokens = Some(input);
        record.output_tokens = Some(output);
        record.count_source = Some(CountSource::Usage);
        record
    }

    #[tokio::test(start_paused = true)]
    async fn keeps_arrivals_and_lengths_of_the_last_requests_only() {
        let recent = RecentRequests::new(3);
        let (m, n) = (LabelText::from("m"), LabelText::from("n"));
        tokio::time::advance(Duration::from_millis(1000)).await;
        recent.finished(&record(&m, Operation::Chat, 400, 10, 5));
        tokio::time::advance(Duration::from_millis(100)).await;
        recent.finished(&record(&m, Operation::TextCompletion, 50, 20, 6));
        recent.finished(&record(&n, Operation::Embeddings, 1, 20, 1));
        let mut unknown = record(&m, Operation::Chat, 1, 1, 1);
        unknown.input_tokens = None;
        recent.finished(&unknown);
        let trace = recent.trace();
        let offsets: Vec<u64> = trace.rows.iter().map(|r| r.timestamp).collect();
        assert_eq!(offsets, [0, 450], "arrival = end − e2e, from the first");
        assert_eq!(trace.rows[0].api.as_deref(), Some("chat"));
        assert_eq!(trace.rows[1].api.as_deref(), Some("completions"));
        assert_eq!((trace.rows[1].input_length, trace.rows[1].output_length), (20, 6));
        assert_eq!(trace.rows[0].stream, Some(true));
        for _ in 0..3 {
            recent.finished(&record(&m, Operation::Messages, 0, 1, 2));
        }
        let trace = recent.trace();
        assert_eq!(trace.rows.len(), 3, "bounded");
        assert!(trace.rows.iter().all(|r| r.api.as_deref() == Some("messages")));
        let kept = recent.kept.lock().unwrap();
        assert!(
            kept.iter().all(|k| std::ptr::eq(k.model.as_str(), m.as_str())),
            "rows share the model's label, never a copy"
        );
    }

    /// A kept request costs a few dozen bytes.
    const _: () = assert!(BYTES_PER_REQUEST <= 64);

    #[tokio::test]
    async fn the_page_is_the_trace_written_frame_by_frame_and_at_most_two_at_once() {
        use http_body_util::BodyExt;
        let recent = Arc::new(RecentRequests::new(2000));
        let model = LabelText::from("m");
        for i in 0..1300u64 {
            let mut r = record(&model, Operation::Chat, i % 7, 10 + i, 1 + i % 5);
            r.reasoning_tokens = (i % 3 == 0).then_some(1);
            recent.finished(&r);
        }
        let mut page = recent.page().await.unwrap();
        let mut frames = 0;
        let mut text = Vec::new();
        while let Some(frame) = page.frame().await {
            text.extend_from_slice(&frame.unwrap().into_data().unwrap());
            frames += 1;
        }
        assert_eq!(frames, 3, "512 rows a frame");
        assert_eq!(String::from_utf8(text).unwrap(), recent.trace().to_jsonl());
        drop(page);
        // Two pages at once; a third waits for one to end.
        let (one, two) = (recent.page().await.unwrap(), recent.page().await.unwrap());
        assert!(recent.page().await.is_none());
        drop(one);
        assert!(recent.page().await.is_some());
        drop(two);
    }
}
