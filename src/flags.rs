//! What the command line and the tools share: the parsers of flag values and the exit status
//! of a bad configuration. The tools use these, not the CLI, which sits above them.

use std::time::Duration;

/// Exit status for a bad configuration (EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;

/// A duration flag: `1m30s`, `250ms`, or a bare number of seconds (`2`, `0.5`).
pub fn duration(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => Ok(Duration::from_secs_f64(seconds)),
        Ok(_) => Err(format!("`{text}` is not a duration")),
        Err(_) => {
            humantime::parse_duration(text).map_err(|e| format!("`{text}` is not a duration like 5s or 250ms: {e}"))
        }
    }
}

/// A probability flag: a number from 0 to 1.
pub fn probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("`{text}` is not a probability between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("0.5"), Ok(Duration::from_millis(500)));
        assert!(duration("-1").unwrap_err().contains("not a duration"));
        assert!(duration("soon").unwrap_err().contains("like 5s or 250ms"));
    }

    #[test]
    fn probabilities_lie_between_zero_and_one() {
        assert_eq!(probability("0.25"), Ok(0.25));
        assert!(probability("1.5").is_err() && probability("x").is_err());
    }
}
