//! The bounded window of recent requests a model is fitted on: the window is cut into
//! slices of equal length and each slice keeps a uniform random sample (a reservoir) of
//! its requests, so memory stays bounded whatever the traffic and every minute is heard.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// Slices per window.
const SLICES: u32 = 30;
/// Requests kept per slice: at most 7,680 over the whole window.
const PER_SLICE: usize = 256;

/// What one successful request tells the model (seconds and requests in flight; NaN when
/// the request did not show it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// In flight at its arrival, itself included.
    pub arrival_load: f32,
    /// Mean in flight over its decode.
    pub decode_load: f32,
    /// Mean in flight over the whole request.
    pub whole_load: f32,
    /// Requests arriving per second over its decode.
    pub decode_arrivals: f32,
    /// Time to first token.
    pub ttft: f32,
    /// Time per output token (its slowest choice's).
    pub tpot: f32,
    /// End-to-end latency.
    pub e2e: f32,
    /// Output tokens.
    pub output_tokens: f32,
}

#[derive(Debug)]
struct Slice {
    start: Instant,
    seen: u64,
    samples: Vec<Sample>,
}

/// The engine's recent samples.
#[derive(Debug)]
pub struct SampleWindow {
    length: Duration,
    slice: Duration,
    slices: VecDeque<Slice>,
    rng: SmallRng,
}

impl SampleWindow {
    /// An empty window of `length` (at least 30 s).
    pub fn new(length: Duration) -> Self {
        Self {
            length,
            slice: length / SLICES,
            slices: VecDeque::new(),
            rng: SmallRng::seed_from_u64(0x11_5e),
        }
    }

    /// Adds a request that finished at `now`.
    pub fn add(&mut self, now: Instant, sample: Sample) {
        self.expire(now);
        let fresh = self.slices.back().is_none_or(|s| now >= s.start + self.slice);
        if fresh {
            self.slices.push_back(Slice {
                start: now,
                seen: 0,
                samples: Vec::new(),
            });
        }
        let slice = self.slices.back_mut().expect("a slice was just ensured");
        slice.seen += 1;
        if slice.samples.len() < PER_SLICE {
            slice.samples.push(sample);
        } else {
            let pick = self.rng.random_range(0..slice.seen);
            if let Some(kept) = slice.samples.get_mut(pick as usize) {
                *kept = sample;
            }
        }
    }

    /// The samples of requests that finished within the window before `now`.
    pub fn samples(&mut self, now: Instant) -> Vec<Sample> {
        self.expire(now);
        self.slices.iter().flat_map(|s| s.samples.iter().copied()).collect()
    }

    fn expire(&mut self, now: Instant) {
        while let Some(oldest) = self.slices.front() {
            if now.saturating_duration_since(oldest.start) < self.length + self.slice {
                break;
            }
            self.slices.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(load: f32) -> Sample {
        Sample {
            arrival_load: load,
            decode_load: load,
            whole_load: load,
            decode_arrivals: 0.0,
            ttft: 0.1,
            tpot: 0.02,
            e2e: 1.0,
            output_tokens: 32.0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_and_old_requests_leave() {
        let mut window = SampleWindow::new(Duration::from_secs(30 * 60));
        // 100 requests a second for 40 minutes: 240,000 requests, at most 7,680 kept.
        for minute in 0..40u32 {
            for _ in 0..6000 {
                window.add(Instant::now(), sample(minute as f32));
            }
            tokio::time::advance(Duration::from_secs(60)).await;
        }
        let now = Instant::now();
        let samples = window.samples(now);
        assert!(samples.len() <= 7_680, "{}", samples.len());
        assert!(
            samples.iter().all(|s| s.decode_load >= 9.0),
            "the first ten minutes left"
        );
        assert!(samples.len() >= 7_000, "every slice of the window kept its full sample");
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(window.samples(Instant::now()).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_slice_keeps_a_uniform_sample() {
        let mut window = SampleWindow::new(Duration::from_secs(30 * 60));
        for i in 0..10_000 {
            window.add(Instant::now(), sample(i as f32));
        }
        let samples = window.samples(Instant::now());
        assert_eq!(samples.len(), PER_SLICE);
        let mean = samples.iter().map(|s| s.decode_load as f64).sum::<f64>() / samples.len() as f64;
        assert!((mean - 5000.0).abs() < 600.0, "{mean}");
    }
}
