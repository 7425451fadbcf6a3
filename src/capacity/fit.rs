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
    let line_residuals = |[base, slope]: &[f64; 2]| points.iter().map(|&(x, y)| y - (base + slope * x)).collect();
    let ([base, slope], weights, scale) = reweighted(
        points.len(),
        |weights| weighted_line(points, weights).map(|(base, slope)| [base, slope]),
        line_residuals,
    )?;
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let spread_x: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let mut residuals: Vec<f64> = line_residuals(&[base, slope]);
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

/// `y = base + slope × x1 + stall × x2`, fitted, with the two coefficients' standard errors.
#[derive(Debug, Clone, PartialEq)]
pub struct PlaneFit {
    /// The intercept.
    pub base: f64,
    /// The coefficient of x1.
    pub slope: f64,
    /// The coefficient of x2.
    pub stall: f64,
    /// The standard error of `slope`.
    pub slope_error: f64,
    /// The standard error of `stall`.
    pub stall_error: f64,
}

/// Fits the plane through `points` (x1, x2, y) with the same Huber reweighting as
/// [`robust_line`]; `None` with fewer than four points or when x1 and x2 do not vary apart.
pub fn robust_plane(points: &[(f64, f64, f64)]) -> Option<PlaneFit> {
    if points.len() < 4 {
        return None;
    }
    let (_, weights, scale) = reweighted(
        points.len(),
        |weights| weighted_plane(points, weights).map(|p| p.coefficients),
        |[base, slope, stall]| {
            points
                .iter()
                .map(|&(x1, x2, y)| y - (base + slope * x1 + stall * x2))
                .collect()
        },
    )?;
    // The same solve as the last iteration's: its weights are the final ones.
    let plane = weighted_plane(points, &weights)?;
    let [base, slope, stall] = plane.coefficients;
    Some(PlaneFit {
        base,
        slope,
        stall,
        slope_error: scale * plane.inverse_spread[0].sqrt(),
        stall_error: scale * plane.inverse_spread[1].sqrt(),
    })
}

/// Huber's iteratively reweighted least squares: `solve` fits the coefficients under the
/// weights, `residuals` gives each point's residual under the coefficients. Returns the
/// coefficients, the final weights and the residuals' robust scale; `None` when a solve fails.
fn reweighted<const K: usize>(
    n: usize,
    solve: impl Fn(&[f64]) -> Option<[f64; K]>,
    residuals: impl Fn(&[f64; K]) -> Vec<f64>,
) -> Option<([f64; K], Vec<f64>, f64)> {
    let mut weights = vec![1.0; n];
    let mut coefficients = solve(&weights)?;
    let mut scale = 0.0;
    for _ in 0..MAX_ITERATIONS {
        let residuals = residuals(&coefficients);
        scale = robust_scale(&residuals);
        if scale == 0.0 {
            break; // most points lie on the fit already
        }
        let cut = HUBER_K * scale;
        for (w, r) in weights.iter_mut().zip(&residuals) {
            *w = if r.abs() <= cut { 1.0 } else { cut / r.abs() };
        }
        let next = solve(&weights)?;
        let settled = next
            .iter()
            .zip(&coefficients)
            .all(|(a, b)| (a - b).abs() <= 1e-12 * b.abs().max(1e-12));
        coefficients = next;
        if settled {
            break;
        }
    }
    Some((coefficients, weights, scale))
}

struct Plane {
    /// base, slope, stall.
    coefficients: [f64; 3],
    /// The diagonal of the inverse of the centred regressors' weighted spread matrix.
    inverse_spread: [f64; 2],
}

/// Weighted least squares in two regressors; `None` when they do not vary apart.
fn weighted_plane(points: &[(f64, f64, f64)], weights: &[f64]) -> Option<Plane> {
    let total: f64 = weights.iter().sum();
    let mean = |f: fn(&(f64, f64, f64)) -> f64| points.iter().zip(weights).map(|(p, w)| w * f(p)).sum::<f64>() / total;
    let (m1, m2, my) = (mean(|p| p.0), mean(|p| p.1), mean(|p| p.2));
    let (mut s11, mut s12, mut s22, mut s1y, mut s2y) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for ((x1, x2, y), w) in points.iter().zip(weights) {
        let (d1, d2, dy) = (x1 - m1, x2 - m2, y - my);
        s11 += w * d1 * d1;
        s12 += w * d1 * d2;
        s22 += w * d2 * d2;
        s1y += w * d1 * dy;
        s2y += w * d2 * dy;
    }
    let det = s11 * s22 - s12 * s12;
    if det.is_nan() || det <= 1e-12 * s11 * s22 {
        return None;
    }
    let slope = (s22 * s1y - s12 * s2y) / det;
    let stall = (s11 * s2y - s12 * s1y) / det;
    Some(Plane {
        coefficients: [my - slope * m1 - stall * m2, slope, stall],
        inverse_spread: [s22 / det, s11 / det],
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
    fn a_plane_separates_two_causes() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
        let points: Vec<(f64, f64, f64)> = (0..2000)
            .map(|_| {
                let (x1, x2) = (rng.random_range(2.0..20.0), rng.random_range(0.0..0.3));
                (
                    x1,
                    x2,
                    0.010 + 0.0005 * x1 + 0.02 * x2 + rng.random_range(-0.0002..0.0002),
                )
            })
            .collect();
        let fit = robust_plane(&points).unwrap();
        assert!(
            (fit.base - 0.010).abs() < 1e-4 && (fit.slope - 0.0005).abs() < 1e-5,
            "{fit:?}"
        );
        assert!((fit.stall - 0.02).abs() < 5e-4 && fit.stall_error < 5e-4, "{fit:?}");
        // The same x2 as x1 in other units: nothing tells them apart.
        let collinear: Vec<_> = points.iter().map(|p| (p.0, 2.0 * p.0, p.2)).collect();
        assert_eq!(robust_plane(&collinear), None);
    }

    #[test]
    fn no_spread_no_line() {
        assert_eq!(robust_line(&[(4.0, 1.0), (4.0, 2.0), (4.0, 3.0)]), None);
        assert_eq!(robust_line(&[(1.0, 1.0), (2.0, 2.0)]), None);
    }
}
