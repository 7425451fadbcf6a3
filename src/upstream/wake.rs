//! The waker an engine connection and its response body are polled with. The two wake each
//! other at every frame (the connection hands the frame over, the body takes it), and both
//! are polled by the task that serves the client: passed on, each such wake-up would have the
//! task polled a second time, through every layer, for nothing. Wake-ups that come while the
//! task is polling them are kept back instead, and passed on only if that poll ends pending.

use crate::own_wake::TaskWaker;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

/// The task is polling the connection or its body.
const POLLING: u8 = 1;
/// A wake-up came since the poll began, or since the last one ended.
const WOKEN: u8 = 2;

/// A connection's own waker, and the task's waker that it passes wake-ups on to.
#[derive(Debug)]
pub struct ConnWaker {
    signal: Arc<Signal>,
    /// `signal` as a waker: what the connection and its body are polled with.
    waker: Waker,
    /// The task's waker that `signal` passes wake-ups to, kept here too (see [`TaskWaker`]).
    task: Option<Waker>,
}

/// Notes wake-ups, and passes on those that come while the task is not polling.
#[derive(Debug)]
struct Signal {
    state: AtomicU8,
    task: TaskWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING == 0 {
            self.task.wake();
        }
    }
}

impl ConnWaker {
    /// A waker not yet tied to any task.
    pub fn new() -> Self {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(0),
            task: TaskWaker::default(),
        });
        Self {
            waker: Waker::from(signal.clone()),
            signal,
            task: None,
        }
    }

    /// A poll by the task that `task` wakes begins: returns the waker to poll with.
    pub fn enter(&mut self, task: &Waker) -> &Waker {
        self.signal.task.keep(&mut self.task, task);
        self.signal.state.store(POLLING, Ordering::Release);
        &self.waker
    }

    /// The poll has ended; `pending` if it gave nothing. A pending poll that was woken while it
    /// ran wakes the task, so that nothing waits on a wake-up kept back. A poll that gave
    /// something is polled again by whoever took it, and needs no wake-up.
    pub fn leave(&self, pending: bool) {
        let woken = self.signal.state.swap(0, Ordering::AcqRel) & WOKEN != 0;
        if pending && woken {
            if let Some(task) = &self.task {
                task.wake_by_ref();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A task's waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn task() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count::default());
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_wake_up_between_polls_reaches_the_task() {
        let (count, task) = task();
        let mut conn = ConnWaker::new();
        let own = conn.enter(&task).clone();
        conn.leave(true);
        own.wake_by_ref();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_wake_up_during_a_poll_that_gives_something_is_dropped() {
        let (count, task) = task();
        let mut conn = ConnWaker::new();
        conn.enter(&task).wake_by_ref();
        conn.leave(false);
        assert_eq!(count.0.load(Ordering::Relaxed), 0, "the taker polls again anyway");
        conn.enter(&task);
        conn.leave(true);
        assert_eq!(count.0.load(Ordering::Relaxed), 0, "nothing was kept back");
    }

    #[test]
    fn a_wake_up_during_a_pending_poll_wakes_the_task_once_it_ends() {
        let (count, task) = task();
        let mut conn = ConnWaker::new();
        let own = conn.enter(&task).clone();
        own.wake_by_ref();
        own.wake_by_ref();
        assert_eq!(count.0.load(Ordering::Relaxed), 0, "not while the task polls");
        conn.leave(true);
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_new_task_takes_over_the_wake_ups() {
        let (first, first_task) = task();
        let (second, second_task) = task();
        let mut conn = ConnWaker::new();
        conn.enter(&first_task);
        conn.leave(true);
        let own = conn.enter(&second_task).clone();
        conn.leave(true);
        own.wake_by_ref();
        assert_eq!(first.0.load(Ordering::Relaxed), 0);
        assert_eq!(second.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_wake_up_from_another_thread_during_a_pending_poll_is_not_lost() {
        for _ in 0..1000 {
            let (count, task) = task();
            let mut conn = ConnWaker::new();
            let own = conn.enter(&task).clone();
            let waking = std::thread::spawn(move || own.wake_by_ref());
            conn.leave(true);
            waking.join().unwrap();
            assert_eq!(
                count.0.load(Ordering::Relaxed),
                1,
                "woken once: by the poll's end or by the wake-up"
            );
        }
    }
}
