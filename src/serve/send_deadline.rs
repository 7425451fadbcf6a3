//! The send deadline of a response body: once a frame is ready for the client, the client must
//! take it within `send_timeout`. Over HTTP/1.1 a client that stops reading fills the socket;
//! over HTTP/2 it can also keep its flow-control window shut, and then hyper simply stops asking
//! the body for frames, so no write ever times out. Either way the body is not asked for its next
//! frame; the server's watchdog, one task that looks at every response a few times per send
//! timeout, notices, drops the body (the engine's request is cancelled with it and its
//! in-flight slot returned), and the stream is reset the next time hyper looks at it.

use super::activity::OpenRequest;
use crate::metrics::limits::LimitCounters;
use crate::metrics::ClientTimeout;
use crate::upstream::BoxError;
use hyper::body::{Body, Frame, SizeHint};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tracing::debug;

/// The client took no frame of a response for the send timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client took nothing of the response for {}", humantime::format_duration(*.0))]
pub struct SendStalled(pub Duration);

/// A response body whose next frame the client must take within its send timeout.
pub struct SendDeadlineBody<B> {
    shared: Arc<Shared<B>>,
    /// Where the watchdog holds it, to let go of it when it ends.
    watched: Option<(Arc<Watchdog<B>>, u64)>,
    timeout: Duration,
    ended: bool,
}

/// What the body and the watchdog share.
struct Shared<B> {
    /// The body and the request it keeps open; `None` once ended, dropped or stalled.
    body: Mutex<Option<(B, OpenRequest)>>,
    /// The watchdog's looks done when a frame became ready and the client had still to ask for
    /// the next, plus one; 0 while the body itself waits (for the engine). Counting looks
    /// rather than reading the clock keeps a frame's cost to one store.
    client_turn: AtomicU64,
}

impl<B> Shared<B> {
    fn new(body: B, open: OpenRequest, client_turn: u64) -> Self {
        Self {
            body: Mutex::new(Some((body, open))),
            client_turn: AtomicU64::new(client_turn),
        }
    }

    fn body(&self) -> MutexGuard<'_, Option<(B, OpenRequest)>> {
        self.body.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the client has left a frame untaken for the whole send timeout, seen at look
    /// number `look`: its turn began before the look `LOOKS_PER_TIMEOUT` looks earlier.
    fn stalled_at(&self, look: u64) -> bool {
        match self.client_turn.load(Ordering::Relaxed) {
            0 => false,
            began => look >= began + LOOKS_PER_TIMEOUT,
        }
    }

    /// Drops the body and the request it keeps open (outside the lock).
    fn release(&self) {
        let released = self.body().take();
        drop(released);
    }
}

/// How many times the watchdog looks per send timeout.
const LOOKS_PER_TIMEOUT: u64 = 4;

/// One server's responses under the send deadline, looked at together by one task every
/// quarter of the timeout: a stall is let go between one and one and a quarter send timeouts
/// after the client stopped taking frames. One task for all, rather than a timer each.
pub struct Watchdog<B> {
    timeout: Duration,
    counters: Option<LimitCounters>,
    bodies: Mutex<Watched<B>>,
    /// The looks done so far: the clock the responses' turns are told by.
    looks: AtomicU64,
}

/// The responses being watched, by a number of their own.
struct Watched<B> {
    next: u64,
    bodies: HashMap<u64, Arc<Shared<B>>>,
}

impl<B: Body + Unpin + Send + 'static> Watchdog<B> {
    /// A watchdog for `timeout`, counting what it lets go in `counters`; its task ends once the
    /// watchdog is dropped.
    pub fn start(timeout: Duration, counters: Option<LimitCounters>) -> Arc<Self> {
        let watchdog = Arc::new(Self {
            timeout,
            counters,
            bodies: Mutex::new(Watched {
                next: 0,
                bodies: HashMap::new(),
            }),
            looks: AtomicU64::new(0),
        });
        tokio::spawn(look_every(
            Arc::downgrade(&watchdog),
            timeout / LOOKS_PER_TIMEOUT as u32,
        ));
        watchdog
    }

    /// `body` of the request `open`, under the send deadline.
    pub fn watch(self: &Arc<Self>, body: B, open: OpenRequest) -> SendDeadlineBody<B> {
        // The head is sent: the client's turn to take the first frame.
        let shared = Arc::new(Shared::new(body, open, self.client_turn()));
        let id = {
            let mut watched = self.watched();
            let id = watched.next;
            watched.next += 1;
            watched.bodies.insert(id, shared.clone());
            id
        };
        SendDeadlineBody {
            shared,
            watched: Some((self.clone(), id)),
            timeout: self.timeout,
            ended: false,
        }
    }
}

impl<B> Watchdog<B> {
    fn watched(&self) -> MutexGuard<'_, Watched<B>> {
        self.bodies.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a response whose client's turn begins now records.
    fn client_turn(&self) -> u64 {
        self.looks.load(Ordering::Relaxed) + 1
    }

    /// Lets go of every response whose client has left a frame untaken for the timeout.
    fn look(&self) {
        let look = self.looks.fetch_add(1, Ordering::Relaxed) + 1;
        let mut stalled = Vec::new();
        self.watched().bodies.retain(|_, shared| {
            let late = shared.stalled_at(look);
            if late {
                stalled.push(shared.clone());
            }
            !late
        });
        for shared in stalled {
            let Some((body, open)) = shared.body().take() else {
                continue;
            };
            drop(body);
            open.end_stalled();
            debug!(
                send_timeout_secs = self.timeout.as_secs_f64(),
                "response released: the client took nothing of it for the send timeout"
            );
            if let Some(counters) = &self.counters {
                counters.count_client_timeout(ClientTimeout::Send);
            }
        }
    }

    fn forget(&self, id: u64) {
        let forgotten = self.watched().bodies.remove(&id);
        drop(forgotten);
    }
}

impl<B: Body + Unpin + Send + 'static> SendDeadlineBody<B> {
    /// `body` of the request `open`, with no send deadline.
    pub fn unwatched(body: B, open: OpenRequest) -> Self {
        Self {
            shared: Arc::new(Shared::new(body, open, 0)),
            watched: None,
            timeout: Duration::ZERO,
            ended: false,
        }
    }
}

/// Looks at the watchdog's responses every `every`, until the watchdog is gone.
async fn look_every<B: Body + Unpin + Send + 'static>(watchdog: Weak<Watchdog<B>>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match watchdog.upgrade() {
            Some(watchdog) => watchdog.look(),
            None => return,
        }
    }
}

impl<B> Body for SendDeadlineBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let shared = &this.shared;
        let mut slot = shared.body();
        let Some((body, _)) = slot.as_mut() else {
            this.ended = true;
            return Poll::Ready(Some(Err(Box::new(SendStalled(this.timeout)))));
        };
        if this.watched.is_some() {
            shared.client_turn.store(0, Ordering::Relaxed);
        }
        let polled = Pin::new(body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) => {
                if let Some((watchdog, _)) = &this.watched {
                    shared.client_turn.store(watchdog.client_turn(), Ordering::Relaxed);
                }
            }
            Poll::Ready(_) => {
                let ended = slot.take();
                drop(slot);
                drop(ended);
                this.ended = true;
                if let Some((watchdog, id)) = this.watched.take() {
                    watchdog.forget(id);
                }
            }
            Poll::Pending => {}
        }
        polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
            || self
                .shared
                .body()
                .as_ref()
                .is_some_and(|(body, _)| body.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.shared
            .body()
            .as_ref()
            .map_or_else(SizeHint::default, |(body, _)| body.size_hint())
    }
}

impl<B> Drop for SendDeadlineBody<B> {
    fn drop(&mut self) {
        self.shared.release();
        if let Some((watchdog, id)) = self.watched.take() {
            let forgotten = watchdog.watched().bodies.remove(&id);
            drop(forgotten);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::activity::Activity;
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    /// A body fed through a channel: pending while the sender is quiet, ended when it is
    /// dropped; the `Arc` counts whether it is still alive.
    struct Fed(mpsc::Receiver<Bytes>, #[allow(dead_code)] Arc<()>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.get_mut().0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    fn fed(activity: &Arc<Activity>, timeout: Duration) -> (mpsc::Sender<Bytes>, Arc<()>, SendDeadlineBody<Fed>) {
        let (tx, rx) = mpsc::channel(8);
        let alive = Arc::new(());
        let watchdog = Watchdog::start(timeout, None);
        let body = watchdog.watch(Fed(rx, alive.clone()), activity.open());
        (tx, alive, body)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_no_one_asks_for_is_released_at_the_send_timeout() {
        let activity = Activity::new();
        let (tx, alive, mut body) = fed(&activity, Duration::from_secs(10));
        tx.send(Bytes::from_static(b"one")).await.unwrap();
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "one");
        // The client now takes nothing (its window is shut): 9 s on, the body is still held;
        // the watchdog, looking every 2.5 s, lets it go within a quarter timeout of 10 s.
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(Arc::strong_count(&alive), 2);
        tokio::time::sleep(Duration::from_millis(3600)).await;
        assert_eq!(Arc::strong_count(&alive), 1, "released with its request");
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.is::<SendStalled>(), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_is_let_go_between_one_and_one_and_a_quarter_timeouts_after_it_began() {
        let activity = Activity::new();
        let (tx, alive, mut body) = fed(&activity, Duration::from_secs(10));
        let start = Instant::now();
        tx.send(Bytes::from_static(b"one")).await.unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_data());
        // The next frame is taken between two looks (at 2.5 s and 5 s): the client's turn then
        // begins at 1.3 s, and it takes nothing more.
        tokio::time::sleep(Duration::from_millis(1300)).await;
        tx.send(Bytes::from_static(b"two")).await.unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_data());
        tokio::time::sleep_until(start + Duration::from_millis(11_290)).await;
        assert_eq!(Arc::strong_count(&alive), 2, "held for the whole timeout");
        tokio::time::sleep_until(start + Duration::from_millis(1300 + 12_500)).await;
        assert_eq!(Arc::strong_count(&alive), 1, "let go within a quarter timeout more");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_is_no_longer_watched() {
        let activity = Activity::new();
        let watchdog = Watchdog::start(Duration::from_secs(10), None);
        let (tx, rx) = mpsc::channel(1);
        let mut body = watchdog.watch(Fed(rx, Arc::new(())), activity.open());
        assert_eq!(watchdog.watched().bodies.len(), 1);
        drop(tx);
        assert!(body.frame().await.is_none());
        assert_eq!(watchdog.watched().bodies.len(), 0, "forgotten at its end");
        let other = watchdog.watch(Fed(mpsc::channel(1).1, Arc::new(())), activity.open());
        drop(other);
        assert_eq!(watchdog.watched().bodies.len(), 0, "and when dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_that_is_slow_is_not_the_clients_stall() {
        let activity = Activity::new();
        let (tx, alive, mut body) = fed(&activity, Duration::from_secs(10));
        let feeder = tokio::spawn(async move {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(25)).await;
                tx.send(Bytes::from_static(b"x")).await.unwrap();
            }
        });
        // The client asks at once every time: 100 s of a slow engine, never a stall.
        for _ in 0..4 {
            assert!(body.frame().await.unwrap().unwrap().is_data());
        }
        assert!(body.frame().await.is_none());
        assert_eq!(Arc::strong_count(&alive), 1, "ended, and let go");
        feeder.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_whose_first_frame_is_never_asked_for_is_released_too() {
        let activity = Activity::new();
        let (_tx, alive, body) = fed(&activity, Duration::from_secs(10));
        let idle = activity.clone();
        let start = Instant::now();
        // The request counts as open until the watchdog lets it go; then the connection, whose
        // client reads nothing, is done with at once.
        assert_eq!(
            idle.done(Duration::from_secs(5)).await,
            crate::serve::activity::Done::Stalled
        );
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(Arc::strong_count(&alive), 1);
        drop(body);
    }
}
