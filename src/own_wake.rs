//! A future that shares its task with a busier one and is looked at only when something it
//! waits on wakes it. A connection's task wakes for every chunk it moves; the futures that
//! watch for the connection's end (shutdown, idleness, the first request's deadline) need a
//! look only when their own signal or timer fires. Polled on every chunk, they cost a lock on
//! the shutdown signal that every connection shares. The task's waker such a future passes its
//! wake-ups on to is a [`TaskWaker`], which the engine connection's own waker uses too.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// `future`, polled on its first poll and then only after one of its own wake-ups.
pub struct OnOwnWake<F> {
    future: Pin<Box<F>>,
    signal: Arc<Signal>,
    /// `signal` as a waker: what `future` is polled with.
    waker: Waker,
    /// The task's waker that `signal` passes wake-ups to, kept here too (see [`TaskWaker`]).
    task: Option<Waker>,
}

impl<F> std::fmt::Debug for OnOwnWake<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnOwnWake")
            .field("woken", &self.signal.woken.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Notes the future's wake-ups and passes them on to its task.
struct Signal {
    woken: AtomicBool,
    task: TaskWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// The waker of the task that polls a future, where the future's own waker, woken from any
/// thread, can pass a wake-up on. Its owner keeps a copy beside it, so that a poll notices a
/// new task without the lock.
#[derive(Debug, Default)]
pub struct TaskWaker(Mutex<Option<Waker>>);

impl TaskWaker {
    /// Wakes the task, once one has polled.
    pub fn wake(&self) {
        if let Some(task) = self.0.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            task.wake_by_ref();
        }
    }

    /// Keeps `task` for wake-ups to come, unless `kept` (the owner's copy) already wakes it.
    pub fn keep(&self, kept: &mut Option<Waker>, task: &Waker) {
        if !kept.as_ref().is_some_and(|kept| kept.will_wake(task)) {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(task.clone());
            *kept = Some(task.clone());
        }
    }
}

impl<F: Future> OnOwnWake<F> {
    /// Wraps `future`.
    pub fn new(future: F) -> Self {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(true),
            task: TaskWaker::default(),
        });
        Self {
            future: Box::pin(future),
            waker: Waker::from(signal.clone()),
            signal,
            task: None,
        }
    }

    /// The future, to change (a timer reset, say); it is looked at on the next poll.
    pub fn change(&mut self) -> Pin<&mut F> {
        self.signal.woken.store(true, Ordering::Release);
        self.future.as_mut()
    }
}

impl<F: Future> Future for OnOwnWake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.signal.task.keep(&mut this.task, cx.waker());
        // A wake-up after this swap finds the flag clear and sets it again: none is lost.
        if !this.signal.woken.load(Ordering::Acquire) || !this.signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.future.as_mut().poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::Notify;

    /// Counts its polls and completes once `notify` fires.
    async fn counted(polls: &AtomicUsize, notify: &Notify) {
        let notified = notify.notified();
        tokio::pin!(notified);
        std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            notified.as_mut().poll(cx)
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn it_is_polled_on_its_own_wake_ups_only() {
        let (polls, notify) = (AtomicUsize::new(0), Notify::new());
        let mut watched = OnOwnWake::new(counted(&polls, &notify));
        let mut busy = tokio::time::interval(Duration::from_millis(10));
        for _ in 0..100 {
            tokio::select! {
                biased;
                _ = busy.tick() => {}
                _ = &mut watched => panic!("completed before its signal"),
            }
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1, "100 other wake-ups, one look");
        notify.notify_one();
        watched.await;
        assert_eq!(polls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_wake_up_reaches_the_task_whose_waker_is_newest() {
        let (polls, notify) = (AtomicUsize::new(0), Notify::new());
        let mut watched = std::pin::pin!(OnOwnWake::new(counted(&polls, &notify)));
        let (first, second) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
        let waker = Waker::from(first.clone());
        assert!(watched.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        let waker = Waker::from(second.clone());
        assert!(watched.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        notify.notify_one();
        assert_eq!(
            (first.0.load(Ordering::Relaxed), second.0.load(Ordering::Relaxed)),
            (0, 1)
        );
        assert!(watched.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_wake_up_from_another_thread_is_lost() {
        for _ in 0..1000 {
            let notify = Arc::new(Notify::new());
            let signal = notify.clone();
            let fire = tokio::spawn(async move { signal.notify_one() });
            tokio::time::timeout(Duration::from_secs(10), OnOwnWake::new(notify.notified()))
                .await
                .expect("woken");
            fire.await.unwrap();
        }
    }

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}
