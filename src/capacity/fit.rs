//! A robust straight line through (load, latency) points: Huber-weighted least squares,
//! iteratively reweighted, so that a few requests slowed by something else (a long prefill
//! beside them, a GC pause) do not tilt it.

use crate::quantile::nearest_rank;

/// Huber's tuning constant: 95 % efficiency on normal noise.
const HUBER_K: f64 = 1.345;
/// The median absolute deviation of normal noise times this is its standard deviation.
const MAD_TO_SIGMA: f64 = 1.4826;
const MAX_ITERATIONS: usize = 50;

/// `y = base + slope × x`, fitted, with what is needed to judge it.
#[derive(Debug, Clone, PartialEq)]
pub struct LineFit {
    /// The intercept.
    pub base: f64,
    /// The slope.
    pub slope: f64,
    /// The slope's standard error (robust scale of the residuals over the spread of x).
    pub slope_error: f64,
    /// Share of the variation in y the line explains (weighted R², 0–1).
    pub fit_ratio: f64,
    /// Each point's residual `y − line(x)`, sorted ascending.
    pub residuals: Vec<f64>,
}

impl LineFit {
    /// The line at `x`.
    pub fn at(&self, x: f64) -> f64 {
        self.base + self.slope * x
    }

    /// The residual at quantile `q` (nearest rank): the line plus it is the `q` quantile.
    pub fn residual_quantile(&self, q: f64) -> f64 {
        nearest_rank(&self.residuals, q)
    }
}

/// Fits the line through `points` (x, y); `None` with fewer than three points or no
/// spread in x.
pub fn robust_line(points: &[(f64, f64)]) -> Option<LineFit> {
    if points.len() < 3 {
        return None;
    }
    let mut weights = vec![1.0; points.len()];
    let (mut base, mut slope) = weighted_line(points, &weights)?;
    let mut scale = 0.0;
    for _ in 0..MAX_ITERATIONS {
        let residuals: Vec<f64> = points.iter().map(|&(x, y)| y - (base + slope * x)).collect();
        scale = robust_scale(&residuals);
        if scale == 0.0 {
            break; // most points lie on the line already
        }
        for (w, r) in weights.iter_mut().zip(&residuals) {
            let cut = HUBER_K * scale;
            *w = if r.abs() <= cut { 1.0 } else { cut / r.abs() };
        }
        let (next_base, next_slope) = weighted_line(points, &weights)?;
        let settled = (next_base - base).abs() <= 1e-12 * base.abs().max(1e-12)
            && (next_slope - slope).abs() <= 1e-12 * slope.abs().max(1e-12);
        (base, slope) = (next_base, next_slope);
        if settled {
            break;
        }
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let spread_x: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let mut residuals: Vec<f64> = points.iter().map(|&(x, y)| y - (base + slope * x)).collect();
    let fit_ratio = weighted_r2(points, &weights, &residuals);
    residuals.sort_by(f64::total_cmp);
    Some(LineFit {
        base,
        slope,
        slope_error: scale / spread_x.sqrt(),
        fit_ratio,
        residuals,
    })
}

/// Weighted least squares; `None` when the weighted x has no spread.
fn weighted_line(points: &[(f64, f64)], weights: &[f64]) -> Option<(f64, f64)> {
    let total: f64 = weights.iter().sum();
    let mean = |f: fn(&(f64, f64)) -> f64| points.iter().zip(weights).map(|(p, w)| w * f(p)).sum::<f64>() / total;
    let (mean_x, mean_y) = (mean(|p| p.0), mean(|p| p.1));
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for ((x, y), w) in points.iter().zip(weights) {
        sxy += w * (x - mean_x) * (y - mean_y);
        sxx += w * (x - mean_x) * (x - mean_x);
    }
    if sxx.is_nan() || sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some((mean_y - slope * mean_x, slope))
}

/// The standard deviation of the residuals, estimated from their median absolute value.
fn robust_scale(residuals: &[f64]) -> f64 {
    let mut absolute: Vec<f64> = residuals.iter().map(|r| r.abs()).collect();
    absolute.sort_by(f64::total_cmp);
    MAD_TO_SIGMA * nearest_rank(&absolute, 0.5)
}

fn weighted_r2(points: &[(f64, f64)], weights: &[f64], residuals: &[f64]) -> f64 {
    let total: f64 = weights.iter().sum();
    let mean_y = points.iter().zip(weights).map(|(p, w)| w * p.1).sum::<f64>() / total;
    let explained_not: f64 = residuals.iter().zip(weights).map(|(r, w)| w * r * r).sum();
    let variation: f64 = points
        .iter()
        .zip(weights)
        .map(|(p, w)| w * (p.1 - mean_y).powi(2))
        .sum();
    if variation > 0.0 {
        (1.0 - explained_not / variation).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn an_exact_line_is_recovered() {
        let points: Vec<_> = (1..=20).map(|c| (c as f64, 0.010 + 0.0005 * c as f64)).collect();
        let fit = robust_line(&points).unwrap();
        assert!(
            (fit.base - 0.010).abs() < 1e-12 && (fit.slope - 0.0005).abs() < 1e-12,
            "{fit:?}"
        );
        assert!((fit.fit_ratio - 1.0).abs() < 1e-9);
        assert!((fit.at(40.0) - 0.030).abs() < 1e-12);
    }

    #[test]
    fn outliers_barely_tilt_it() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut points: Vec<(f64, f64)> = (0..2000)
            .map(|_| {
                let c = rng.random_range(2.0..20.0);
                (c, 0.010 + 0.0005 * c + rng.random_range(-0.0005..0.0005))
            })
            .collect();
        // 5 % of requests slowed fivefold by something else, all at high load.
        for p in points.iter_mut().take(100) {
            p.0 = 19.0;
            p.1 *= 5.0;
        }
        let fit = robust_line(&points).unwrap();
        assert!((fit.slope - 0.0005).abs() / 0.0005 < 0.05, "{fit:?}");
        assert!((fit.base - 0.010).abs() / 0.010 < 0.05, "{fit:?}");
        assert!(fit.slope_error < 0.00005);
        // The 95th percentile residual sees the slow ones' tail; the median does not.
        assert!(fit.residual_quantile(0.5).abs() < 0.0002);
        assert!(fit.residual_quantile(0.99) > 0.02);
    }

    #[test]
    fn no_spread_no_line() {
        assert_eq!(robust_line(&[(4.0, 1.0), (4.0, 2.0), (4.0, 3.0)]), None);
        assert_eq!(robust_line(&[(1.0, 1.0), (2.0, 2.0)]), None);
    }
}
