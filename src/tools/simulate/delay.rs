//! Timing distributions for the simulated engine: fixed, uniform or normal.

use rand::Rng;
use rand_distr::{Distribution, Normal};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A delay drawn per token (TPOT) or per request (TTFT).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delay {
    /// Always the same: `50ms`.
    Fixed(Duration),
    /// Uniform between two bounds: `uniform:20ms..80ms`.
    Uniform(Duration, Duration),
    /// Normal, clamped at zero: `normal:50ms,5ms` (mean, standard deviation).
    Normal(Duration, Duration),
}

impl Delay {
    /// Draws one delay.
    pub fn sample(&self, rng: &mut impl Rng) -> Duration {
        match *self {
            Delay::Fixed(d) => d,
            Delay::Uniform(low, high) => rng.random_range(low..=high),
            Delay::Normal(mean, sd) => {
                let normal = Normal::new(mean.as_secs_f64(), sd.as_secs_f64()).expect("sd is finite and >= 0");
                Duration::from_secs_f64(normal.sample(rng).max(0.0))
            }
        }
    }
}

impl FromStr for Delay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let duration = |d: &str| {
            humantime::parse_duration(d.trim()).map_err(|e| format!("`{d}` is not a duration like 50ms: {e}"))
        };
        if let Some(range) = s.strip_prefix("uniform:") {
            let (low, high) = range
                .split_once("..")
                .ok_or_else(|| format!("`{s}`: write uniform:LOW..HIGH, e.g. uniform:20ms..80ms"))?;
            let (low, high) = (duration(low)?, duration(high)?);
            if low > high {
                return Err(format!("`{s}`: the low bound is above the high bound"));
            }
            Ok(Delay::Uniform(low, high))
        } else if let Some(params) = s.strip_prefix("normal:") {
            let (mean, sd) = params
                .split_once(',')
                .ok_or_else(|| format!("`{s}`: write normal:MEAN,SD, e.g. normal:50ms,5ms"))?;
            Ok(Delay::Normal(duration(mean)?, duration(sd)?))
        } else {
            Ok(Delay::Fixed(duration(s)?))
        }
    }
}

impl fmt::Display for Delay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = humantime::format_duration;
        match *self {
            Delay::Fixed(d) => write!(f, "{}", h(d)),
            Delay::Uniform(a, b) => write!(f, "uniform:{}..{}", h(a), h(b)),
            Delay::Normal(m, s) => write!(f, "normal:{},{}", h(m), h(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parses_and_prints_each_form() {
        for text in ["50ms", "uniform:20ms..80ms", "normal:50ms,5ms"] {
            assert_eq!(text.parse::<Delay>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn rejects_malformed_delays_with_a_hint() {
        assert!("uniform:80ms..20ms".parse::<Delay>().unwrap_err().contains("low bound"));
        assert!("uniform:20ms"
            .parse::<Delay>()
            .unwrap_err()
            .contains("uniform:LOW..HIGH"));
        assert!("normal:5ms".parse::<Delay>().unwrap_err().contains("normal:MEAN,SD"));
        assert!("fast".parse::<Delay>().unwrap_err().contains("not a duration"));
    }

    #[test]
    fn samples_stay_within_their_distribution() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let uniform: Delay = "uniform:10ms..20ms".parse().unwrap();
        let normal: Delay = "normal:1ms,5ms".parse().unwrap();
        for _ in 0..1000 {
            let d = uniform.sample(&mut rng);
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
            let _never_negative = normal.sample(&mut rng);
        }
        assert_eq!(
            Delay::Fixed(Duration::from_millis(3)).sample(&mut rng),
            Duration::from_millis(3)
        );
    }
}
