//! Quantiles of observed values, shared by the sweep's reports and the capacity model.

/// The nearest-rank `q` quantile of sorted values: a value that was observed, never an
/// interpolation.
pub fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (sorted.len() as f64 * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quantile_is_an_observed_value() {
        let thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(nearest_rank(&thousand, 0.99), 990.0);
        assert_eq!(nearest_rank(&thousand, 0.0), 1.0);
        assert_eq!(nearest_rank(&[5.0], 0.99), 5.0);
        assert!(nearest_rank(&[], 0.5).is_nan());
    }
}
