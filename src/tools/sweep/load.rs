//! Holds one load against the target: closed-loop clients or Poisson arrivals. Requests sent
//! during the warm-up are not recorded; those sent in the measured window are, and the load
//! is held until the last of them ends, so every recorded request ran under the same load.

use super::client::{Requester, Sample};
use super::prompts::Entry;
use super::stats::Load;
use bytes::Bytes;
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// A closed-loop client pauses this long after a failed request, so that an engine failing
/// fast is not hammered in a tight loop (and the failures do not crowd out the measurements).
pub const FAILURE_PAUSE: Duration = Duration::from_millis(50);

/// How one step runs.
#[derive(Debug, Clone)]
pub struct StepPlan {
    /// Unrecorded time to reach the load.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Seed for arrival times.
    pub seed: u64,
}

/// The request bodies, taken in turn.
#[derive(Debug)]
pub struct Bodies {
    bodies: Vec<Bytes>,
    next: AtomicUsize,
}

impl Bodies {
    /// Every entry's request body, asking for its own output length or `output_tokens`.
    pub fn new(requester: &Requester, entries: &[Entry], output_tokens: u32) -> Self {
        Self {
            bodies: entries
                .iter()
                .map(|e| requester.body(&e.prompt, e.output_tokens.unwrap_or(output_tokens)))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    fn next(&self) -> Bytes {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.bodies[i % self.bodies.len()].clone()
    }
}

/// How sending one request went.
enum Sent {
    /// It succeeded.
    Succeeded,
    /// It failed.
    Failed,
    /// Nothing was sent: the step is over (the window passed and no recorded request is left).
    Over,
}

/// What the requests of one step share.
struct Shared {
    requester: Requester,
    bodies: Arc<Bodies>,
    record_from: Instant,
    record_until: Instant,
    /// Recorded requests not yet finished.
    outstanding: AtomicUsize,
    /// Woken when a recorded request ends.
    ended: Notify,
    samples: Mutex<Vec<Sample>>,
}

impl Shared {
    /// Sends one request; records it when it was sent in the window.
    async fn one_request(&self) -> Sent {
        if self.over() {
            return Sent::Over;
        }
        let now = Instant::now();
        let recorded = now >= self.record_from && now < self.record_until;
        if recorded {
            self.outstanding.fetch_add(1, Ordering::AcqRel);
        }
        let sample = self.requester.send(self.bodies.next()).await;
        let sent = if sample.failure.is_some() {
            Sent::Failed
        } else {
            Sent::Succeeded
        };
        if recorded {
            self.samples.lock().expect("samples lock").push(sample);
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.ended.notify_waiters();
        }
        sent
    }

    /// The window passed and every recorded request ended.
    fn over(&self) -> bool {
        Instant::now() >= self.record_until && self.outstanding.load(Ordering::Acquire) == 0
    }
}

/// Holds `load` as `plan` says and returns the recorded requests, in the order they ended.
pub async fn run_step(
    requester: &Requester,
    bodies: Arc<Bodies>,
    load: Load,
    plan: &StepPlan,
    bar: &ProgressBar,
) -> Vec<Sample> {
    let start = Instant::now();
    let shared = Arc::new(Shared {
        requester: requester.clone(),
        bodies,
        record_from: start + plan.warmup,
        record_until: start + plan.warmup + plan.duration,
        outstanding: AtomicUsize::new(0),
        ended: Notify::new(),
        samples: Mutex::new(Vec::new()),
    });
    let mut tasks = JoinSet::new();
    match load {
        Load::Concurrency(clients) => {
            for _ in 0..clients {
                let shared = shared.clone();
                tasks.spawn(async move {
                    loop {
                        match shared.one_request().await {
                            Sent::Over => break,
                            Sent::Failed => tokio::time::sleep(FAILURE_PAUSE).await,
                            Sent::Succeeded => {}
                        }
                    }
                });
            }
        }
        Load::Rate(rate) => {
            let shared = shared.clone();
            tasks.spawn(arrivals(shared, rate, plan.seed));
        }
    }
    let total = plan.warmup + plan.duration;
    bar.set_length(total.as_millis() as u64);
    loop {
        let ended = shared.ended.notified();
        if shared.over() {
            break;
        }
        let elapsed = start.elapsed();
        bar.set_position(elapsed.min(total).as_millis() as u64);
        let (recorded, failed) = {
            let samples = shared.samples.lock().expect("samples lock");
            (samples.len(), samples.iter().filter(|s| s.failure.is_some()).count())
        };
        let phase = if elapsed < plan.warmup {
            "warming up".to_string()
        } else if elapsed < total {
            "measuring".to_string()
        } else {
            format!("waiting for {} in flight", shared.outstanding.load(Ordering::Relaxed))
        };
        bar.set_message(format!("{load}: {phase}, {recorded} done, {failed} failed"));
        tokio::select! {
            _ = ended => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    // Requests sent after the window only held the load: they are dropped unfinished.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let samples = std::mem::take(&mut *shared.samples.lock().expect("samples lock"));
    samples
}

/// Poisson arrivals: each request in its own task, sent at exponentially spaced times.
async fn arrivals(shared: Arc<Shared>, rate: f64, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let gaps = Exp::new(rate).expect("a positive rate");
    let mut requests = JoinSet::new();
    let mut next = Instant::now();
    while !shared.over() {
        tokio::time::sleep_until(next).await;
        let shared_one = shared.clone();
        requests.spawn(async move { shared_one.one_request().await });
        next += Duration::from_secs_f64(gaps.sample(&mut rng));
        // Reap finished requests so the set stays as large as what is in flight.
        while requests.try_join_next().is_some() {}
    }
}
