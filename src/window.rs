//! Sliding windows of counters: lazily rotated ring buffers, O(1) per event, bounded memory.

use std::time::Duration;
use tokio::time::Instant;

/// Buckets per window: the oldest one may lie partly outside the window (at most 1/60).
const BUCKETS: u32 = 60;

/// The Google SRE workbook's alerting windows.
pub const WINDOWS: [(&str, Duration); 7] = [
    ("5m", Duration::from_secs(5 * 60)),
    ("30m", Duration::from_secs(30 * 60)),
    ("1h", Duration::from_secs(3600)),
    ("2h", Duration::from_secs(2 * 3600)),
    ("6h", Duration::from_secs(6 * 3600)),
    ("1d", Duration::from_secs(24 * 3600)),
    ("3d", Duration::from_secs(3 * 24 * 3600)),
];

/// Counts of `N` kinds over a sliding window of fixed length.
#[derive(Debug, Clone)]
pub struct Ring<const N: usize> {
    width: Duration,
    buckets: Vec<[u64; N]>,
    /// Index of the head bucket: the one that holds the latest counts.
    head: usize,
    /// Where the head bucket ends: until then, an event needs no rotation and no arithmetic.
    head_end: Instant,
}

impl<const N: usize> Ring<N> {
    /// A window of length `window` starting empty at `now`.
    pub fn new(window: Duration, now: Instant) -> Self {
        Self {
            width: window / BUCKETS,
            buckets: vec![[0; N]; BUCKETS as usize],
            head: 0,
            head_end: now + window / BUCKETS,
        }
    }

    /// Moves the head to the bucket holding `now`, clearing the buckets that expired.
    fn rotate(&mut self, now: Instant) {
        if now < self.head_end {
            return;
        }
        // The head bucket has ended: one step, and one more for each whole width past its end.
        let past = now.saturating_duration_since(self.head_end);
        let steps = 1 + (past.as_nanos() / self.width.as_nanos().max(1)) as u64;
        let len = self.buckets.len() as u64;
        for _ in 0..steps.min(len) {
            self.head = (self.head + 1) % self.buckets.len();
            self.buckets[self.head] = [0; N];
        }
        self.head_end += self.width * steps as u32;
    }

    /// Adds `counts` at `now`.
    pub fn add(&mut self, now: Instant, counts: [u64; N]) {
        self.rotate(now);
        for (total, n) in self.buckets[self.head].iter_mut().zip(counts) {
            *total += n;
        }
    }

    /// The totals over the window ending at `now`.
    pub fn sum(&mut self, now: Instant) -> [u64; N] {
        self.rotate(now);
        let mut totals = [0; N];
        for bucket in &self.buckets {
            for (total, n) in totals.iter_mut().zip(bucket) {
                *total += n;
            }
        }
        totals
    }
}

/// The same counts over every alerting window plus the SLO period.
#[derive(Debug, Clone)]
pub struct Windows<const N: usize> {
    rings: Vec<Ring<N>>,
}

impl<const N: usize> Windows<N> {
    /// Rings for [`WINDOWS`] followed by one for `period`.
    pub fn new(period: Duration, now: Instant) -> Self {
        let lengths = WINDOWS.iter().map(|(_, d)| *d).chain([period]);
        Self {
            rings: lengths.map(|length| Ring::new(length, now)).collect(),
        }
    }

    /// Adds `counts` to every window.
    pub fn add(&mut self, now: Instant, counts: [u64; N]) {
        for ring in &mut self.rings {
            ring.add(now, counts);
        }
    }

    /// Totals per alerting window, in [`WINDOWS`] order.
    pub fn sums(&mut self, now: Instant) -> [[u64; N]; 7] {
        std::array::from_fn(|i| self.rings[i].sum(now))
    }

    /// Totals over the SLO period.
    pub fn period_sum(&mut self, now: Instant) -> [u64; N] {
        self.rings[WINDOWS.len()].sum(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_leave_the_window_after_its_length() {
        let start = Instant::now();
        let mut ring = Ring::<2>::new(Duration::from_secs(300), start);
        ring.add(start, [10, 1]);
        tokio::time::advance(Duration::from_secs(100)).await;
        ring.add(Instant::now(), [5, 5]);
        assert_eq!(ring.sum(Instant::now()), [15, 6]);
        tokio::time::advance(Duration::from_secs(200)).await;
        assert_eq!(ring.sum(Instant::now()), [5, 5], "the first counts are 300 s old: gone");
        tokio::time::advance(Duration::from_secs(100)).await;
        assert_eq!(ring.sum(Instant::now()), [0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_ends_exactly_one_width_after_it_began() {
        // 60 s in 60 buckets of 1 s: counts at 0 s and 0.999 s share the first bucket.
        let start = Instant::now();
        let mut ring = Ring::<1>::new(Duration::from_secs(60), start);
        ring.add(start, [1]);
        ring.add(start + Duration::from_millis(999), [1]);
        assert_eq!(ring.sum(start + Duration::from_millis(59_999)), [2]);
        ring.add(start + Duration::from_millis(59_999), [4]);
        assert_eq!(
            ring.sum(start + Duration::from_secs(60)),
            [4],
            "the first bucket is 60 s old"
        );
        assert_eq!(ring.sum(start + Duration::from_millis(60_999)), [4]);
        assert_eq!(ring.sum(start + Duration::from_secs(120)), [0]);
    }

    #[tokio::test(start_paused = true)]
    async fn long_idle_gaps_clear_everything_at_once() {
        let start = Instant::now();
        let mut ring = Ring::<1>::new(Duration::from_secs(60), start);
        ring.add(start, [7]);
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert_eq!(ring.sum(Instant::now()), [0]);
        ring.add(Instant::now(), [3]);
        assert_eq!(ring.sum(Instant::now()), [3]);
    }

    #[tokio::test(start_paused = true)]
    async fn every_window_and_the_period() {
        let start = Instant::now();
        let mut windows = Windows::<1>::new(Duration::from_secs(30 * 86_400), start);
        windows.add(start, [4]);
        tokio::time::advance(Duration::from_secs(3600)).await;
        let sums = windows.sums(Instant::now());
        assert_eq!(
            sums.map(|s| s[0]),
            [0, 0, 0, 4, 4, 4, 4],
            "gone from 5m, 30m and 1h; kept from 2h on"
        );
        assert_eq!(windows.period_sum(Instant::now()), [4]);
    }
}
