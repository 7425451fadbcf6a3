//! The load each request runs under: the number of requests in flight on the engine and its
//! running integral over time, read when a request arrives, at its first token and at its end;
//! and the engine's recent traffic (arrival rate and mean in flight) from a reading kept each
//! second. O(1) per request, nothing per chunk, and the lock is never held across an await.

use crate::record::RequestLoad;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A reading is kept for the traffic history at most this often.
const HISTORY_STEP: Duration = Duration::from_secs(1);
/// Readings kept for the traffic history: two minutes at one a second.
const HISTORY_LEN: usize = 120;

/// In-flight requests on the engine, their integral over time (request-seconds) and the
/// arrivals counted so far.
#[derive(Debug)]
pub struct LoadMeter {
    state: Mutex<MeterState>,
}

#[derive(Debug)]
struct MeterState {
    in_flight: u64,
    integral: f64,
    arrivals: u64,
    last: Instant,
    /// A reading at most every [`HISTORY_STEP`], oldest first.
    history: VecDeque<Reading>,
}

impl MeterState {
    /// Brings the integral up to `now` (never backwards: readings may come out of order) and
    /// keeps a reading for the history when a step has passed since the last one kept.
    fn advance(&mut self, now: Instant) {
        // After a quiet spell longer than the history, only its end is kept.
        let horizon = HISTORY_STEP * HISTORY_LEN as u32;
        let long_quiet = self
            .history
            .back()
            .is_some_and(|kept| now.saturating_duration_since(kept.at) > horizon);
        if long_quiet && now - horizon >= self.last {
            self.history.clear();
            self.keep(self.reading_at(now - horizon));
        }
        // A reading for each step that passed without an event: nothing arrived or left then.
        while let Some(at) = self
            .history
            .back()
            .map(|kept| kept.at + HISTORY_STEP)
            .filter(|at| *at < now && *at >= self.last)
        {
            self.keep(self.reading_at(at));
        }
        if now > self.last {
            self.integral = self.reading_at(now).integral;
            self.last = now;
        }
        let due = self
            .history
            .back()
            .is_none_or(|kept| self.last.saturating_duration_since(kept.at) >= HISTORY_STEP);
        if due {
            self.keep(self.reading());
        }
    }

    /// Keeps `reading` in the history, dropping the oldest when it is full.
    fn keep(&mut self, reading: Reading) {
        if self.history.len() == HISTORY_LEN {
            self.history.pop_front();
        }
        self.history.push_back(reading);
    }

    /// The meter as it reads at the last change.
    fn reading(&self) -> Reading {
        self.reading_at(self.last)
    }

    /// The meter as it reads at `at` (not before the last change), nothing having changed since.
    fn reading_at(&self, at: Instant) -> Reading {
        Reading {
            at,
            in_flight: self.in_flight,
            integral: self.integral + self.in_flight as f64 * at.saturating_duration_since(self.last).as_secs_f64(),
            arrivals: self.arrivals,
        }
    }
}

/// How much the arrival rate varied from one reading to the next beyond what Poisson arrivals
/// at `rate` would show ((requests per second)²; 0 unless clearly more, by three standard
/// errors).
fn rate_variance(readings: &[Reading], rate: f64) -> f64 {
    let (mut squares, mut expected, mut noise, mut weight) = (0.0, 0.0, 0.0, 0.0);
    for pair in readings.windows(2) {
        let seconds = (pair[1].at - pair[0].at).as_secs_f64();
        let mean = rate * seconds;
        squares += ((pair[1].arrivals - pair[0].arrivals) as f64 - mean).powi(2);
        expected += mean;
        noise += 2.0 * mean * mean;
        weight += seconds * seconds;
    }
    let excess = squares - expected;
    if weight > 0.0 && excess > 3.0 * noise.sqrt() {
        excess / weight
    } else {
        0.0
    }
}

/// The engine's traffic over a recent span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Generation requests arriving per second.
    pub arrival_rate: f64,
    /// Time-weighted mean of the generation requests in flight.
    pub in_flight: f64,
    /// How much the arrival rate varied over the span beyond Poisson arrivals' chance
    /// ((requests per second)²): bursts.
    pub rate_variance: f64,
    /// The span actually covered (shorter at start, longer after a quiet spell).
    pub span: Duration,
}

/// A reading of the meter: the in-flight count and the integral at an instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// When it was read.
    pub at: Instant,
    /// Requests in flight then.
    pub in_flight: u64,
    /// Request-seconds accumulated up to then.
    pub integral: f64,
    /// Requests that had arrived by then.
    pub arrivals: u64,
}

impl Reading {
    /// Requests arriving per second between `self` and a later reading; `None` when no time
    /// passed.
    pub fn arrivals_until(&self, later: &Reading) -> Option<f64> {
        let span = later.at.checked_duration_since(self.at)?.as_secs_f64();
        (span > 0.0).then(|| later.arrivals.saturating_sub(self.arrivals) as f64 / span)
    }

    /// The time-weighted mean number in flight between `self` and a later reading; `None`
    /// when no time passed.
    pub fn mean_until(&self, later: &Reading) -> Option<f64> {
        let span = later.at.checked_duration_since(self.at)?.as_secs_f64();
        (span > 0.0).then(|| (later.integral - self.integral) / span)
    }
}

impl Default for LoadMeter {
    fn default() -> Self {
        Self {
            state: Mutex::new(MeterState {
                in_flight: 0,
                integral: 0.0,
                arrivals: 0,
                last: Instant::now(),
                history: VecDeque::new(),
            }),
        }
    }
}

impl LoadMeter {
    /// Reads the meter at `now`.
    pub fn read(&self, now: Instant) -> Reading {
        let mut state = self.state.lock().expect("load meter lock");
        state.advance(now);
        state.reading()
    }

    /// The traffic from the oldest kept reading no older than `span` (the newest older one
    /// after a quiet spell) until `now`; `None` before any time has passed.
    pub fn traffic(&self, now: Instant, span: Duration) -> Option<Traffic> {
        let mut state = self.state.lock().expect("load meter lock");
        state.advance(now);
        let end = state.reading();
        let from = state
            .history
            .iter()
            .position(|r| end.at.saturating_duration_since(r.at) <= span && r.at < end.at)
            .or_else(|| state.history.iter().rposition(|r| r.at < end.at))?;
        let readings: Vec<Reading> = state.history.range(from..).copied().chain([end]).collect();
        let first = readings[0];
        let seconds = (end.at - first.at).as_secs_f64();
        let arrival_rate = (end.arrivals - first.arrivals) as f64 / seconds;
        Some(Traffic {
            arrival_rate,
            in_flight: (end.integral - first.integral) / seconds,
            rate_variance: rate_variance(&readings, arrival_rate),
            span: end.at - first.at,
        })
    }

    fn change(&self, now: Instant, arriving: bool) -> Reading {
        let mut state = self.state.lock().expect("load meter lock");
        state.advance(now);
        if arriving {
            state.in_flight += 1;
            state.arrivals += 1;
        } else {
            state.in_flight = state.in_flight.saturating_sub(1);
        }
        state.reading()
    }
}

/// One request counted in its model's meter from its arrival until it is dropped.
#[derive(Debug)]
pub struct InFlight {
    meter: Arc<LoadMeter>,
    arrival: Reading,
    first_token: Option<Reading>,
}

impl InFlight {
    /// Counts a request arriving at `now` in `meter`.
    pub fn arrive(meter: Arc<LoadMeter>, now: Instant) -> Self {
        let arrival = meter.change(now, true);
        Self {
            meter,
            arrival,
            first_token: None,
        }
    }

    /// Marks the request's first token at `now` (later calls do nothing).
    pub fn first_token(&mut self, now: Instant) {
        if self.first_token.is_none() {
            self.first_token = Some(self.meter.read(now));
        }
    }

    /// The load the request ran under, as it ends at `now` (it still counts itself).
    pub fn load(&self, now: Instant) -> RequestLoad {
        let end = self.meter.read(now);
        RequestLoad {
            arrival: self.arrival.in_flight as f64,
            decode: self.first_token.and_then(|first| first.mean_until(&end)),
            whole: self.arrival.mean_until(&end),
            decode_arrivals: self.first_token.and_then(|first| first.arrivals_until(&end)),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.meter.change(Instant::now(), false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SECOND: Duration = Duration::from_secs(1);
    const SPAN: Duration = Duration::from_secs(20);

    #[tokio::test(start_paused = true)]
    async fn the_mean_load_over_a_decode_is_time_weighted() {
        let meter = Arc::new(LoadMeter::default());
        let t0 = Instant::now();
        let mut a = InFlight::arrive(meter.clone(), t0);
        assert_eq!(a.arrival.in_flight, 1);
        a.first_token(t0 + 100 * MS);
        // b runs from 200 ms to 600 ms: a's decode (100..900 ms) saw 2 for 400 of 800 ms.
        tokio::time::advance(200 * MS).await;
        let b = InFlight::arrive(meter.clone(), Instant::now());
        assert_eq!(b.arrival.in_flight, 2);
        tokio::time::advance(400 * MS).await;
        drop(b);
        tokio::time::advance(300 * MS).await;
        let load = a.load(Instant::now());
        assert_eq!(load.arrival, 1.0);
        assert!((load.decode.unwrap() - 1.5).abs() < 1e-9, "{load:?}");
        assert!((load.whole.unwrap() - (0.9 + 0.4) / 0.9).abs() < 1e-9, "{load:?}");
        assert_eq!(
            load.decode_arrivals,
            Some(1.0 / 0.8),
            "b arrived in a's 800 ms of decode"
        );
        drop(a);
        assert_eq!(meter.read(Instant::now()).in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_streamed_has_no_decode_load() {
        let meter = Arc::new(LoadMeter::default());
        let a = InFlight::arrive(meter, Instant::now());
        tokio::time::advance(50 * MS).await;
        let load = a.load(Instant::now());
        assert_eq!(load.decode, None);
        assert_eq!(load.whole, Some(1.0));
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_is_the_arrival_rate_and_mean_in_flight_of_the_recent_span() {
        let meter = Arc::new(LoadMeter::default());
        assert_eq!(meter.traffic(Instant::now(), SPAN), None, "no time has passed");
        // One arrival every 100 ms, each in flight for 500 ms: 10 a second, 5 in flight.
        let mut held = VecDeque::new();
        for _ in 0..600 {
            held.push_back(InFlight::arrive(meter.clone(), Instant::now()));
            if held.len() > 5 {
                held.pop_front();
            }
            tokio::time::advance(100 * MS).await;
        }
        let busy = meter.traffic(Instant::now(), SPAN).unwrap();
        assert_eq!(busy.span, SPAN);
        assert!((busy.arrival_rate - 10.0).abs() < 0.06, "{busy:?}");
        assert!((busy.in_flight - 5.0).abs() < 0.06, "{busy:?}");
        assert_eq!(busy.rate_variance, 0.0, "an arrival every 100 ms is no burst");
        // The load stops: ten seconds later the span holds half of each.
        held.clear();
        tokio::time::advance(10 * SECOND).await;
        let falling = meter.traffic(Instant::now(), SPAN).unwrap();
        assert!((falling.arrival_rate - 5.0).abs() < 0.3, "{falling:?}");
        // A quiet minute, then a quiet day, with nothing read: the span is still the last 20 s.
        for quiet in [60 * SECOND, 86_400 * SECOND] {
            tokio::time::advance(quiet).await;
            let quiet = meter.traffic(Instant::now(), SPAN).unwrap();
            assert_eq!((quiet.arrival_rate, quiet.in_flight, quiet.span), (0.0, 0.0, SPAN));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bursts_show_as_variance_in_the_arrival_rate() {
        let meter = Arc::new(LoadMeter::default());
        // 40 a second for one second in four, none in the other three: a mean of 10 a second.
        for second in 0..20 {
            for _ in 0..if second % 4 == 0 { 40 } else { 0 } {
                drop(InFlight::arrive(meter.clone(), Instant::now()));
                tokio::time::advance(25 * MS).await;
            }
            if second % 4 != 0 {
                tokio::time::advance(SECOND).await;
            }
        }
        let bursty = meter.traffic(Instant::now(), SPAN).unwrap();
        assert!((bursty.arrival_rate - 10.0).abs() < 0.6, "{bursty:?}");
        // The rate is 40 a quarter of the time and 0 otherwise: a variance of 300.
        assert!((bursty.rate_variance - 300.0).abs() < 60.0, "{bursty:?}");
    }

    #[test]
    fn readings_out_of_order_never_run_the_integral_backwards() {
        let meter = LoadMeter::default();
        let now = Instant::now();
        let later = meter.read(now + MS);
        let earlier = meter.read(now);
        assert_eq!(earlier.at, later.at);
        assert_eq!(earlier.integral, later.integral);
    }
}
