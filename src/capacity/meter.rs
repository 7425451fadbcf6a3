//! The load each request runs under: the number of requests in flight on the engine and its
//! running integral over time, read when a request arrives, at its first token and at its end;
//! and the engine's recent traffic (arrival rate and mean in flight) from a reading kept each
//! second. O(1) per request, nothing per chunk, and the lock is never held across an await.

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
        if now > self.last {
            self.integral += self.in_flight as f64 * (now - self.last).as_secs_f64();
            self.last = now;
        }
        let due = self
            .history
            .back()
            .is_none_or(|kept| self.last.saturating_duration_since(kept.at) >= HISTORY_STEP);
        if due {
            if self.history.len() == HISTORY_LEN {
                self.history.pop_front();
            }
            let reading = self.reading();
            self.history.push_back(reading);
        }
    }

    fn reading(&self) -> Reading {
        Reading {
            at: self.last,
            in_flight: self.in_flight,
            integral: self.integral,
            arrivals: self.arrivals,
        }
    }
}

/// The engine's traffic over a recent span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Generation requests arriving per second.
    pub arrival_rate: f64,
    /// Time-weighted mean of the generation requests in flight.
    pub in_flight: f64,
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
            .find(|r| end.at.saturating_duration_since(r.at) <= span)
            .filter(|r| r.at < end.at)
            .or_else(|| state.history.iter().rev().find(|r| r.at < end.at))?;
        let seconds = (end.at - from.at).as_secs_f64();
        Some(Traffic {
            arrival_rate: (end.arrivals - from.arrivals) as f64 / seconds,
            in_flight: (end.integral - from.integral) / seconds,
            span: end.at - from.at,
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

/// The load one request ran under, in requests in flight (itself included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLoad {
    /// In flight when it arrived, itself included: the load its TTFT met.
    pub arrival: f64,
    /// Time-weighted mean in flight from its first token to its end: the load its decode met.
    pub decode: Option<f64>,
    /// Time-weighted mean in flight from its arrival to its end: the load its e2e met.
    pub whole: Option<f64>,
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

    /// Whether the first token has been marked.
    pub fn has_first_token(&self) -> bool {
        self.first_token.is_some()
    }

    /// The load the request ran under, as it ends at `now` (it still counts itself).
    pub fn load(&self, now: Instant) -> RequestLoad {
        let end = self.meter.read(now);
        RequestLoad {
            arrival: self.arrival.in_flight as f64,
            decode: self.first_token.and_then(|first| first.mean_until(&end)),
            whole: self.arrival.mean_until(&end),
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
        // The load stops: ten seconds later the span holds half of each.
        held.clear();
        tokio::time::advance(10 * SECOND).await;
        let falling = meter.traffic(Instant::now(), SPAN).unwrap();
        assert!((falling.arrival_rate - 5.0).abs() < 0.3, "{falling:?}");
        // A quiet minute with nothing read: the span stretches back to the last reading.
        tokio::time::advance(60 * SECOND).await;
        let quiet = meter.traffic(Instant::now(), SPAN).unwrap();
        assert_eq!((quiet.arrival_rate, quiet.in_flight), (0.0, 0.0));
        assert_eq!(quiet.span, 60 * SECOND);
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
