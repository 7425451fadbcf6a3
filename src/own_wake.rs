//! Futures and bodies that share their task with busier ones and are looked at only when
//! something they wait on wakes them.
//!
//! A connection's task wakes for every chunk it moves; the futures that watch for the
//! connection's end (shutdown, idleness, the first request's deadline) need a look only when
//! their own signal or timer fires. Polled on every chunk, they cost a lock on the shutdown
//! signal that every connection shares. A response body waiting for the engine is asked for
//! its next frame twice per wake-up by hyper's HTTP/1.1 server (once to write, once more after
//! the flush); the second ask, passed on, goes through every layer of the body down to the
//! engine's connection for nothing. The task's waker such a future or body passes its wake-ups
//! on to is a [`TaskWaker`], which the engine connection's own waker uses too.

use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// `future`, polled on its first poll and then only after one of its own wake-ups.
pub struct OnOwnWake<F> {
    future: Pin<Box<F>>,
    own: OwnWaker,
}

impl<F> std::fmt::Debug for OnOwnWake<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnOwnWake")
            .field("woken", &self.own.signal.woken.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// `body`, asked for a frame on its first poll, after each frame it gives, and otherwise only
/// after one of its own wake-ups.
pub struct OnOwnWakeBody<B> {
    body: B,
    own: OwnWaker,
}

/// A waker of one's own, and the task's waker it passes wake-ups on to.
struct OwnWaker {
    signal: Arc<Signal>,
    /// `signal` as a waker: what the wrapped future or body is polled with.
    waker: Waker,
    /// The task's waker that `signal` passes wake-ups to, kept here too (see [`TaskWaker`]).
    task: Option<Waker>,
}

impl OwnWaker {
    /// A waker whose first look finds it woken.
    fn new() -> Self {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(true),
            task: TaskWaker::default(),
        });
        Self {
            waker: Waker::from(signal.clone()),
            signal,
            task: None,
        }
    }

    /// Whether a wake-up came since the last look, which it clears; wake-ups to come go to
    /// `task`.
    fn look(&mut self, task: &Waker) -> bool {
        self.signal.task.keep(&mut self.task, task);
        // A wake-up after this swap finds the flag clear and sets it again: none is lost.
        self.signal.woken.load(Ordering::Acquire) && self.signal.woken.swap(false, Ordering::AcqRel)
    }

    /// Makes the next look find it woken, with no wake-up of the task.
    fn set_woken(&self) {
        self.signal.woken.store(true, Ordering::Release);
    }
}

/// Notes its owner's wake-ups and passes them on to the task.
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
        Self {
            future: Box::pin(future),
            own: OwnWaker::new(),
        }
    }

    /// The future, to change (a timer reset, say); it is looked at on the next poll.
    pub fn change(&mut self) -> Pin<&mut F> {
        self.own.set_woken();
        self.future.as_mut()
    }
}

impl<F: Future> Future for OnOwnWake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if !this.own.look(cx.waker()) {
            return Poll::Pending;
        }
        this.future.as_mut().poll(&mut Context::from_waker(&this.own.waker))
    }
}

impl<B> OnOwnWakeBody<B> {
    /// Wraps `body`.
    pub fn new(body: B) -> Self {
        Self {
            body,
            own: OwnWaker::new(),
        }
    }
}

impl<B: Body + Unpin> Body for OnOwnWakeBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if !this.own.look(cx.waker()) {
            return Poll::Pending;
        }
        let polled = Pin::new(&mut this.body).poll_frame(&mut Context::from_waker(&this.own.waker));
        if polled.is_ready() {
            // Whoever took the frame asks for the next without a wake-up.
            this.own.set_woken();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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

    /// A body fed through a channel that counts how often it is asked for a frame.
    struct Fed {
        frames: tokio::sync::mpsc::Receiver<bytes::Bytes>,
        asked: Arc<AtomicUsize>,
    }

    impl Body for Fed {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            let this = self.get_mut();
            this.asked.fetch_add(1, Ordering::Relaxed);
            this.frames
                .poll_recv(cx)
                .map(|frame| frame.map(|data| Ok(Frame::data(data))))
        }
    }

    fn fed() -> (tokio::sync::mpsc::Sender<bytes::Bytes>, Arc<AtomicUsize>, Fed) {
        let (tx, frames) = tokio::sync::mpsc::channel(4);
        let asked = Arc::new(AtomicUsize::new(0));
        (tx, asked.clone(), Fed { frames, asked })
    }

    #[test]
    fn a_body_is_asked_again_after_a_frame_or_a_wake_up_and_not_otherwise() {
        let (tx, asked, body) = fed();
        let mut body = OnOwnWakeBody::new(body);
        let task = Arc::new(Counting::default());
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let mut poll = |body: &mut OnOwnWakeBody<Fed>| Pin::new(body).poll_frame(&mut cx);
        assert!(poll(&mut body).is_pending());
        assert!(poll(&mut body).is_pending());
        assert_eq!(asked.load(Ordering::Relaxed), 1, "nothing woke it: not asked again");
        tx.try_send(bytes::Bytes::from_static(b"a")).unwrap();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "its wake-up reaches the task");
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        assert!(
            poll(&mut body).is_pending(),
            "asked again after a frame, with no wake-up"
        );
        assert_eq!(asked.load(Ordering::Relaxed), 3);
        drop(tx);
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        assert_eq!(asked.load(Ordering::Relaxed), 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_frame_sent_from_another_thread_is_missed() {
        use http_body_util::BodyExt;
        for _ in 0..1000 {
            let (tx, _, body) = fed();
            let mut body = OnOwnWakeBody::new(body);
            let send = tokio::spawn(async move { tx.send(bytes::Bytes::from_static(b"a")).await });
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame()).await;
            assert!(frame.expect("woken").is_some());
            send.await.unwrap().unwrap();
        }
    }

    /// Streams `frames` one at a time through hyper's HTTP/1.1 server to a client on a real
    /// socket (the next only once the client has read the last), and counts how often the
    /// response body was asked for a frame, with the body gated or not.
    async fn asked_per_frame(frames: usize, gated: bool) -> f64 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (tx, asked, body) = fed();
        let body = Mutex::new(Some(body));
        let service = hyper::service::service_fn(move |_| {
            let body = body.lock().unwrap().take().unwrap();
            let body = match gated {
                true => http_body_util::Either::Left(OnOwnWakeBody::new(body)),
                false => http_body_util::Either::Right(body),
            };
            std::future::ready(Ok::<_, std::convert::Infallible>(hyper::Response::new(body)))
        });
        let io = hyper_util::rt::TokioIo::new(server);
        tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
        client.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n").await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        for i in 0..frames {
            tx.send(bytes::Bytes::from(format!("<{i}>"))).await.unwrap();
            let marker = format!("<{i}>");
            while !String::from_utf8_lossy(&seen).contains(&marker) {
                let n = client.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
        }
        asked.load(Ordering::Relaxed) as f64 / frames as f64
    }

    #[tokio::test]
    async fn under_hyper_a_waiting_body_is_asked_once_per_wake_up() {
        let ungated = asked_per_frame(50, false).await;
        let gated = asked_per_frame(50, true).await;
        assert!(
            gated <= 2.1,
            "one ask that gives the frame, one that finds nothing: {gated}"
        );
        assert!(ungated >= 2.9, "hyper asks a waiting body twice per wake-up: {ungated}");
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
