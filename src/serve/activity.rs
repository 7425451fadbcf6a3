//! What one connection holds open: its requests whose responses are not done yet. A connection
//! that holds none for the idle timeout is closed, whatever its protocol, so an idle HTTP/2
//! connection is let go like an idle HTTP/1.1 keep-alive one; one whose last requests were all
//! let go because the client took nothing of them is closed at once (its client does not read).
//! A few atomics and one timer per connection: the timer looks again only when it would have
//! fired.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

/// Why a connection is done with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// Nothing was open for the idle timeout.
    Idle,
    /// Its open requests all ended at their send deadline: the client reads nothing.
    Stalled,
}

/// The requests one connection has open, counted as they start and as their responses end.
#[derive(Debug)]
pub struct Activity {
    open: AtomicUsize,
    born: Instant,
    /// When the connection last had nothing open, in nanoseconds after `born`.
    idle_since: AtomicU64,
    /// The last request to end was let go at its send deadline, leaving nothing open.
    stalled: AtomicBool,
    /// Wakes the watcher when that happens.
    stalled_out: Notify,
}

impl Activity {
    /// A connection with nothing open yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            born: Instant::now(),
            idle_since: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            stalled_out: Notify::new(),
        })
    }

    /// Counts one request open until the returned guard is dropped.
    pub fn open(self: &Arc<Self>) -> OpenRequest {
        self.stalled.store(false, Ordering::Release);
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenRequest {
            activity: self.clone(),
            stalled: false,
        }
    }

    /// Completes once the connection has had nothing open for `timeout` in one stretch, or at
    /// once when its last open requests were let go at their send deadline.
    pub async fn done(&self, timeout: Duration) -> Done {
        loop {
            if self.open.load(Ordering::Acquire) == 0 && self.stalled.load(Ordering::Acquire) {
                return Done::Stalled;
            }
            // While requests are open, look again a timeout later: a request that ends before
            // then is seen idle before its own deadline, which is then kept exactly.
            let wake = match self.open.load(Ordering::Acquire) {
                0 => self.born + Duration::from_nanos(self.idle_since.load(Ordering::Acquire)) + timeout,
                _ => Instant::now() + timeout,
            };
            tokio::select! {
                () = sleep_until(wake) => {}
                () = self.stalled_out.notified() => continue,
            }
            let idle_since = self.born + Duration::from_nanos(self.idle_since.load(Ordering::Acquire));
            if self.open.load(Ordering::Acquire) == 0 && Instant::now() >= idle_since + timeout {
                return Done::Idle;
            }
        }
    }
}

/// One open request of a connection; dropping it closes it.
#[derive(Debug)]
pub struct OpenRequest {
    activity: Arc<Activity>,
    stalled: bool,
}

impl OpenRequest {
    /// Closes it because its client took nothing of its response for the send deadline.
    pub fn end_stalled(mut self) {
        self.stalled = true;
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let activity = &self.activity;
        let since = Instant::now().saturating_duration_since(activity.born).as_nanos() as u64;
        // Noted before the count falls, so a watcher that sees none open sees this time.
        activity.idle_since.store(since, Ordering::Release);
        if self.stalled {
            activity.stalled.store(true, Ordering::Release);
        }
        if activity.open.fetch_sub(1, Ordering::AcqRel) == 1 && self.stalled {
            activity.stalled_out.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_request_that_ended() {
        let activity = Activity::new();
        let start = Instant::now();
        let request = activity.open();
        let ends = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(50)).await;
            drop(request);
        });
        assert_eq!(activity.done(Duration::from_secs(30)).await, Done::Idle);
        assert_eq!(start.elapsed(), Duration::from_secs(80), "50 s busy, then 30 s idle");
        ends.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_within_the_idle_time_starts_it_again() {
        let activity = Activity::new();
        let start = Instant::now();
        let again = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(20)).await;
            let request = again.open();
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(request);
        });
        activity.done(Duration::from_secs(30)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(51));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_had_a_request_is_idle_from_its_start() {
        let activity = Activity::new();
        let start = Instant::now();
        activity.done(Duration::from_secs(30)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_requests_all_stalled_is_done_at_once() {
        let activity = Activity::new();
        let start = Instant::now();
        let (first, second) = (activity.open(), activity.open());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            first.end_stalled();
            tokio::time::sleep(Duration::from_secs(1)).await;
            second.end_stalled();
        });
        assert_eq!(activity.done(Duration::from_secs(30)).await, Done::Stalled);
        assert_eq!(start.elapsed(), Duration::from_secs(61), "when the last one is let go");
    }
}
