//! Holds one load against the target: closed-loop clients, or open-loop arrivals (Poisson,
//! gamma with a burstiness, on/off bursts, or a trace's own times). Requests sent
//! during the warm-up are not recorded; those sent in the measured window are, and the load
//! is held until the last of them ends, so every recorded request ran under the same load.

use super::client::{Planned, Requester, Sample};
use super::health::{ClientHealth, Watch};
use super::stats::Load;
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Gamma};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// How open-loop arrivals are spaced.
    pub arrivals: Arrivals,
}

/// How open-loop arrivals are spaced, at a step's mean rate.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrivals {
    /// Gaps drawn from a gamma distribution of this shape (vLLM's burstiness): 1 is Poisson,
    /// below 1 burstier.
    Gamma {
        /// The shape.
        burstiness: f64,
    },
    /// Poisson within on/off bursts.
    Bursts(Bursts),
    /// Exactly the rate's count of requests in the warm-up and in the window, each at a
    /// uniformly random time (Poisson arrivals given their count).
    Exact,
    /// A trace's own times, divided by a rate scale: one request per time, in order.
    Trace(Arc<Vec<Duration>>),
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals::Gamma { burstiness: 1.0 }
    }
}

/// On/off arrivals: Poisson during each `on` spell at the rate that keeps the step's mean
/// rate, none during each `off` spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bursts {
    /// How long each burst lasts.
    pub on: Duration,
    /// The quiet spell after each burst.
    pub off: Duration,
}

impl Bursts {
    /// Where `busy` seconds of arrival time fall on the clock: the bursts laid end to end
    /// with the quiet spells between them.
    fn clock(&self, busy: f64) -> Duration {
        let on = self.on.as_secs_f64();
        let cycles = (busy / on).floor();
        self.on.saturating_add(self.off).mul_f64(cycles) + Duration::from_secs_f64(busy - cycles * on)
    }

    /// The share of the time arrivals come.
    fn duty(&self) -> f64 {
        self.on.as_secs_f64() / (self.on + self.off).as_secs_f64()
    }
}

/// The requests a step sends, taken in turn (and again from the first when all were sent).
#[derive(Debug)]
pub struct Bodies {
    planned: Vec<Planned>,
    next: AtomicUsize,
}

impl Bodies {
    /// The requests `planned`, in order; at least one.
    pub fn new(planned: Vec<Planned>) -> Self {
        assert!(!planned.is_empty(), "a step sends at least one kind of request");
        Self {
            planned,
            next: AtomicUsize::new(0),
        }
    }

    /// The same requests, from the first again (for another step or target).
    pub fn restart(&self) -> Arc<Self> {
        Arc::new(Self::new(self.planned.clone()))
    }

    /// The requests, in order.
    pub fn planned(&self) -> &[Planned] {
        &self.planned
    }

    fn next(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.planned.len()
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
    /// A trace's arrivals were all sent: its window is over (timers fire late, so a last
    /// arrival due at the window's end may come after it).
    exhausted: AtomicBool,
    /// Woken when a recorded request ends.
    ended: Notify,
    samples: Mutex<Vec<Sample>>,
    /// How late recorded open-loop requests left against their schedule, seconds.
    send_lags: Arc<Mutex<Vec<f64>>>,
}

impl Shared {
    /// Sends the next request; records it when it was sent in the window.
    async fn one_request(&self) -> Sent {
        if self.over() {
            return Sent::Over;
        }
        let recorded = self.begin();
        self.send(self.bodies.next(), recorded).await
    }

    /// Whether a request sent now is recorded; if so it is in flight from now on.
    fn begin(&self) -> bool {
        let now = Instant::now();
        let recorded = now >= self.record_from && now < self.record_until;
        if recorded {
            self.outstanding.fetch_add(1, Ordering::AcqRel);
        }
        recorded
    }

    /// Sends request `index`, [`Shared::begin`] having said whether it is `recorded`.
    async fn send(&self, index: usize, recorded: bool) -> Sent {
        let sample = self.requester.send(&self.bodies.planned[index]).await;
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
        (Instant::now() >= self.record_until || self.exhausted.load(Ordering::Acquire))
            && self.outstanding.load(Ordering::Acquire) == 0
    }
}

/// Holds `load` as `plan` says and returns the recorded requests, in the order they ended,
/// and how the client fared meanwhile.
pub async fn run_step(
    requester: &Requester,
    bodies: Arc<Bodies>,
    load: Load,
    plan: &StepPlan,
    bar: &ProgressBar,
) -> (Vec<Sample>, ClientHealth) {
    let watch = Watch::start();
    let start = Instant::now();
    // A trace's window is its arrivals (an exact count's too), all of them recorded, however
    // late the last one is sent.
    let slack = match plan.arrivals {
        Arrivals::Trace(_) | Arrivals::Exact => Duration::from_secs(24 * 3600),
        _ => Duration::ZERO,
    };
    let shared = Arc::new(Shared {
        requester: requester.clone(),
        bodies,
        record_from: start + plan.warmup,
        record_until: start + plan.warmup + plan.duration + slack,
        outstanding: AtomicUsize::new(0),
        exhausted: AtomicBool::new(false),
        ended: Notify::new(),
        samples: Mutex::new(Vec::new()),
        send_lags: watch.send_lags(),
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
            let times = match plan.arrivals {
                Arrivals::Exact => ArrivalTimes::new(rate, plan.seed, &exact(rate, plan)),
                _ => ArrivalTimes::new(rate, plan.seed, &plan.arrivals),
            };
            tasks.spawn(arrivals(shared, times));
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
    (samples, watch.finish())
}

/// Open-loop arrivals: each request in its own task, sent at its time; the request is picked
/// when it is due, so that the n-th arrival sends the n-th request.
async fn arrivals(shared: Arc<Shared>, times: ArrivalTimes) {
    let mut requests = JoinSet::new();
    let start = Instant::now();
    for offset in times {
        let due = start + offset;
        tokio::time::sleep_until(due).await;
        if shared.over() {
            break;
        }
        let shared_one = shared.clone();
        let (index, recorded) = (shared.bodies.next(), shared.begin());
        if recorded {
            let late = Instant::now().saturating_duration_since(due).as_secs_f64();
            shared.send_lags.lock().expect("send lags lock").push(late);
        }
        requests.spawn(async move { shared_one.send(index, recorded).await });
        // Reap finished requests so the set stays as large as what is in flight.
        while requests.try_join_next().is_some() {}
    }
    // Only a trace runs out; its requests are all counted in flight by now, and run to their end.
    shared.exhausted.store(true, Ordering::Release);
    while requests.join_next().await.is_some() {}
}

/// Exact arrivals for a step at `rate`: round(rate × warm-up) in the warm-up and
/// round(rate × window) in the window, each at a uniformly random time within it, in order.
pub fn exact(rate: f64, plan: &StepPlan) -> Arrivals {
    let mut rng = SmallRng::seed_from_u64(plan.seed);
    let mut times = Vec::new();
    for (from, length) in [(Duration::ZERO, plan.warmup), (plan.warmup, plan.duration)] {
        let count = (rate * length.as_secs_f64()).round() as usize;
        let mut within: Vec<Duration> = (0..count).map(|_| from + length.mul_f64(rng.random::<f64>())).collect();
        within.sort();
        times.extend(within);
    }
    Arrivals::Trace(Arc::new(times))
}

/// The send times of open-loop arrivals at a mean `rate`, from the step's start.
pub struct ArrivalTimes {
    rng: SmallRng,
    gaps: Gaps,
    bursts: Option<Bursts>,
    /// Seconds of arrival time (time within bursts) drawn so far.
    busy: f64,
    /// A trace's times, and the next one.
    trace: Option<(Arc<Vec<Duration>>, usize)>,
}

/// How the gaps between arrivals are drawn.
enum Gaps {
    /// Exponential: Poisson arrivals.
    Exponential(Exp<f64>),
    /// Gamma, of a shape other than 1.
    Gamma(Gamma<f64>),
}

impl ArrivalTimes {
    /// The times of `arrivals` at a mean `rate`, seeded.
    pub fn new(rate: f64, seed: u64, arrivals: &Arrivals) -> Self {
        let (bursts, burstiness, trace) = match arrivals {
            Arrivals::Gamma { burstiness } => (None, *burstiness, None),
            Arrivals::Bursts(bursts) => (Some(*bursts), 1.0, None),
            Arrivals::Trace(times) => (None, 1.0, Some((times.clone(), 0))),
            // Drawn by [`exact`] for the step; alone, the same mean rate as Poisson.
            Arrivals::Exact => (None, 1.0, None),
        };
        let rate = rate / bursts.map_or(1.0, |b| b.duty());
        let gaps = if burstiness == 1.0 {
            Gaps::Exponential(Exp::new(rate).expect("a positive rate"))
        } else {
            // vLLM's definition: shape = burstiness, scale = 1 / (rate × burstiness).
            Gaps::Gamma(Gamma::new(burstiness, 1.0 / (rate * burstiness)).expect("a positive shape and rate"))
        };
        Self {
            rng: SmallRng::seed_from_u64(seed),
            gaps,
            bursts,
            busy: 0.0,
            trace,
        }
    }
}

impl Iterator for ArrivalTimes {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if let Some((times, next)) = &mut self.trace {
            let at = times.get(*next).copied();
            *next += 1;
            return at;
        }
        let at = match self.bursts {
            Some(bursts) => bursts.clock(self.busy),
            None => Duration::from_secs_f64(self.busy),
        };
        self.busy += match &self.gaps {
            Gaps::Exponential(exp) => exp.sample(&mut self.rng),
            Gaps::Gamma(gamma) => gamma.sample(&mut self.rng),
        };
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_lay_busy_time_out_between_quiet_spells() {
        let bursts = Bursts {
            on: Duration::from_secs(2),
            off: Duration::from_secs(3),
        };
        assert_eq!(bursts.duty(), 0.4);
        assert_eq!(bursts.clock(0.0), Duration::ZERO);
        assert_eq!(bursts.clock(1.5), Duration::from_millis(1500));
        assert_eq!(bursts.clock(2.0), Duration::from_secs(5), "the next burst");
        assert_eq!(bursts.clock(4.5), Duration::from_millis(10_500));
    }

    #[test]
    fn exact_arrivals_send_the_rate_s_count_in_the_window() {
        let plan = StepPlan {
            warmup: Duration::from_secs(2),
            duration: Duration::from_secs(10),
            seed: 7,
            arrivals: Arrivals::Exact,
        };
        let Arrivals::Trace(times) = exact(5.0, &plan) else {
            panic!("exact arrivals are a list of times");
        };
        let window = times.iter().filter(|t| **t >= Duration::from_secs(2)).count();
        assert_eq!((times.len(), window), (60, 50), "10 in the warm-up, 50 in the window");
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order");
        assert!(times.iter().all(|t| *t < Duration::from_secs(12)));
        let Arrivals::Trace(again) = exact(5.0, &plan) else {
            panic!("exact arrivals are a list of times");
        };
        assert_eq!(times, again, "seeded");
    }

    #[test]
    fn bursty_arrivals_keep_the_mean_rate_and_come_only_in_bursts() {
        let bursts = Bursts {
            on: Duration::from_secs(1),
            off: Duration::from_secs(3),
        };
        let times: Vec<Duration> = ArrivalTimes::new(10.0, 3, &Arrivals::Bursts(bursts))
            .take_while(|t| *t < Duration::from_secs(400))
            .collect();
        assert!((times.len() as f64 / 400.0 - 10.0).abs() < 0.5, "{}", times.len());
        assert!(times.iter().all(|t| t.as_millis() % 4000 < 1000), "none between bursts");
        let steady: Vec<Duration> = ArrivalTimes::new(10.0, 3, &Arrivals::default())
            .take_while(|t| *t < Duration::from_secs(400))
            .collect();
        assert!((steady.len() as f64 / 400.0 - 10.0).abs() < 0.5, "{}", steady.len());
        assert!(steady.iter().any(|t| t.as_millis() % 4000 >= 1000));
    }
}
