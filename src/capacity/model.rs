//! The latency–load model of the engine's recent requests: each latency fitted against the
//! load it met, with the requests' spread around the fit, and the empirical view per
//! concurrency band.
//!
//! TPOT and e2e are fitted as straight lines in load: a decode step's cost grows about
//! linearly with the running set. TTFT is fitted as a straight line in log space, an
//! exponential in load: it is convex, so it follows the upward bend queueing gives near
//! saturation, and where the data is still linear it extrapolates towards scaling early
//! rather than late. The spread is kept whole (not a quantile of it), so that what it
//! predicts at another load is a distribution the SLO's objective can be read from.

use super::fit::{robust_line, robust_plane, LineFit};
use super::window::Sample;
use crate::quantile::nearest_rank;
use crate::slo::spec::{Slo, SloKind, SloSet};

/// Fewer requests than this in the window: no estimate.
pub const MIN_SAMPLES: usize = 100;
/// Requests beyond the objective's quantile a quantile needs: 99 % needs 500 requests.
pub const MIN_TAIL: f64 = 5.0;
/// The 10th to 90th percentile of load must span at least this many requests.
pub const MIN_LOAD_SPREAD: f64 = 2.0;
/// The slope's standard error must be at most this share of the slope.
pub const MAX_SLOPE_ERROR: f64 = 0.25;
/// A capacity beyond this many times the 90th percentile of load seen is not extrapolated.
pub const MAX_EXTRAPOLATION: f64 = 10.0;
/// Concurrency bands are [c, 2c) for c = 1, 2, 4, … up to this.
const TOP_BAND: u64 = 1024;

/// The load a latency met, and the latency, for one SLO kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// TTFT against the in-flight count at arrival (fitted in log space).
    Ttft,
    /// TPOT against the mean in flight over the decode.
    Tpot,
    /// e2e against the mean in flight over the request.
    E2e,
}

impl Latency {
    /// The latency an SLO judges, with its threshold in seconds; `None` for availability and
    /// for the time to first answer token (reasoning length, not load, decides most of it).
    pub fn of(slo: &Slo) -> Option<(Latency, f64)> {
        match slo.kind {
            SloKind::Ttft(t) => Some((Latency::Ttft, t.as_secs_f64())),
            SloKind::Tpot(t) => Some((Latency::Tpot, t.as_secs_f64())),
            SloKind::E2e(t) => Some((Latency::E2e, t.as_secs_f64())),
            SloKind::AnswerTtft(_) | SloKind::Availability => None,
        }
    }

    /// (load, latency) of a sample, when it shows both.
    fn point(self, s: &Sample) -> Option<(f64, f64)> {
        let value = match self {
            Latency::Ttft => s.ttft,
            Latency::Tpot => s.tpot,
            Latency::E2e => s.e2e,
        };
        let load = self.load(s)?;
        value.is_finite().then_some((load, f64::from(value)))
    }

    /// The load a sample met for this latency, when it shows it.
    pub fn load(self, s: &Sample) -> Option<f64> {
        let load = match self {
            Latency::Ttft => s.arrival_load,
            Latency::Tpot => s.decode_load,
            Latency::E2e => s.whole_load,
        };
        load.is_finite().then_some(f64::from(load))
    }

    fn logarithmic(self) -> bool {
        self == Latency::Ttft
    }
}

/// One latency fitted against load, over the window's samples, with the spread of the
/// requests around the fit: relative to it for TPOT and e2e (a noisy engine's spread grows
/// with its step time), in log space for TTFT.
///
/// TPOT may also carry a stall: when prompts prefilled in the same steps slow the decode,
/// TPOT = (base + per_request × load) / (1 − stall × arrivals per second), fitted as
/// TPOT = base + per_request × load + stall × (arrivals per second × TPOT), and kept when the
/// data shows it clearly (three standard errors above zero).
#[derive(Debug, Clone)]
pub struct LatencyModel {
    kind: Latency,
    fit: LineFit,
    /// Seconds of each decode step lost per request arriving per second (0: none seen).
    stall: f64,
    /// The mean arrivals per second per request in flight: the arrival rate that goes with a
    /// load, where only a load is given.
    rate_per_load: f64,
    /// Each request's deviation from the fit, sorted: `latency / fit − 1`, or `ln latency −
    /// fit` for TTFT.
    spread: Vec<f64>,
    /// The 90th percentile of the load the samples met.
    load_p90: f64,
}

impl LatencyModel {
    /// Fits `kind` over `samples`; `None` when they cannot support a model: fewer than
    /// [`MIN_SAMPLES`], load spread under [`MIN_LOAD_SPREAD`], or a slope that is not
    /// positive within [`MAX_SLOPE_ERROR`].
    pub fn fit(kind: Latency, samples: &[Sample]) -> Option<Self> {
        // (load, arrivals per second over the decode, latency in the fit's terms)
        let points: Vec<(f64, f64, f64)> = samples
            .iter()
            .filter_map(|s| {
                let (load, value) = kind.point(s)?;
                let value = if kind.logarithmic() {
                    value.max(1e-6).ln()
                } else {
                    value
                };
                let rate = f64::from(s.decode_arrivals);
                Some((load, if rate.is_finite() { rate } else { 0.0 }, value))
            })
            .collect();
        if points.len() < MIN_SAMPLES {
            return None;
        }
        let mut loads: Vec<f64> = points.iter().map(|p| p.0).collect();
        loads.sort_by(f64::total_cmp);
        let (p10, p90) = (nearest_rank(&loads, 0.1), nearest_rank(&loads, 0.9));
        if p90 - p10 < MIN_LOAD_SPREAD {
            return None;
        }
        let clear = |slope: f64, error: f64| slope > 0.0 && error <= MAX_SLOPE_ERROR * slope;
        let line: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.2)).collect();
        let mut fit = robust_line(&line)?;
        if !clear(fit.slope, fit.slope_error) {
            return None;
        }
        let mut stall = 0.0;
        if kind == Latency::Tpot {
            let plane: Vec<(f64, f64, f64)> = points.iter().map(|&(l, r, v)| (l, r * v, v)).collect();
            if let Some(p) = robust_plane(&plane) {
                if p.stall > 3.0 * p.stall_error && clear(p.slope, p.slope_error) {
                    (fit.base, fit.slope, fit.slope_error, stall) = (p.base, p.slope, p.slope_error, p.stall);
                }
            }
        }
        let rate_per_load = points.iter().map(|p| p.1 / p.0.max(1.0)).sum::<f64>() / points.len() as f64;
        let mut model = Self {
            kind,
            fit,
            stall,
            rate_per_load,
            spread: Vec::new(),
            load_p90: p90,
        };
        let mut spread: Vec<f64> = points
            .iter()
            .filter_map(|&(load, rate, value)| {
                let fitted = model.fitted(load, rate);
                match kind.logarithmic() {
                    true => Some(value - fitted),
                    false => (fitted > 0.0 && fitted.is_finite()).then(|| value / fitted - 1.0),
                }
            })
            .collect();
        if spread.len() < MIN_SAMPLES {
            return None;
        }
        spread.sort_by(f64::total_cmp);
        model.spread = spread;
        Some(model)
    }

    /// The fitted line in load (in log space for TTFT; for TPOT with a stall, the decode
    /// without prefills beside it).
    pub fn line(&self) -> &LineFit {
        &self.fit
    }

    /// Seconds of each decode step lost per request arriving per second (0: none seen).
    pub fn stall(&self) -> f64 {
        self.stall
    }

    /// The 90th percentile of the load the window's requests met.
    pub fn load_p90(&self) -> f64 {
        self.load_p90
    }

    /// Whether the window holds enough requests to see `objective`'s tail: [`MIN_TAIL`] beyond
    /// its quantile (99 % needs 500).
    pub fn sees_tail_of(&self, objective: f64) -> bool {
        self.spread.len() as f64 * (1.0 - objective) >= MIN_TAIL
    }

    /// The latency at quantile `q` at concurrency `load`, with the arrival rate that goes with it.
    pub fn quantile_at(&self, load: f64, q: f64) -> f64 {
        self.with_spread(
            self.fitted(load, load * self.rate_per_load),
            nearest_rank(&self.spread, q),
        )
    }

    /// The share of requests at concurrency `load`, with `rate` arrivals per second, whose
    /// latency stays within `threshold`: the window's spread around the fit, moved there.
    pub fn attainment_at(&self, load: f64, rate: f64, threshold: f64) -> f64 {
        let fitted = self.fitted(load, rate);
        let room = match self.kind.logarithmic() {
            true => threshold.ln() - fitted,
            false if fitted > 0.0 => threshold / fitted - 1.0,
            false => return 1.0,
        };
        self.spread.partition_point(|v| *v <= room) as f64 / self.spread.len() as f64
    }

    /// The fit at `load` and `rate` (in log space for TTFT); +Inf where the stall would take
    /// every step.
    fn fitted(&self, load: f64, rate: f64) -> f64 {
        let line = self.fit.at(load);
        if self.stall == 0.0 {
            return line;
        }
        let left = 1.0 - self.stall * rate;
        if left > 0.0 {
            line / left
        } else {
            f64::INFINITY
        }
    }

    fn with_spread(&self, fitted: f64, deviation: f64) -> f64 {
        match self.kind.logarithmic() {
            true => (fitted + deviation).exp(),
            false => fitted * (1.0 + deviation),
        }
    }
}

/// The empirical view and the model at one concurrency band [c, 2c) of one SLO.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// The SLO.
    pub slo: String,
    /// The band's lower edge c.
    pub concurrency: u64,
    /// Good over judged requests in the band (NaN below `min_events`).
    pub attainment: f64,
    /// The band's latency at the objective's quantile over the threshold (NaN below `min_events`).
    pub observed_ratio: f64,
    /// The model's latency at the objective's quantile at c·√2 over the threshold (NaN without a model).
    pub model_ratio: f64,
}

/// Served requests the window needs before every deciding latency SLO's tail can be seen:
/// [`MIN_TAIL`] beyond the tightest objective's quantile (500 for 99 %).
pub fn requests_to_see_tail(set: &SloSet) -> u64 {
    set.slos
        .iter()
        .enumerate()
        .filter(|(i, slo)| set.decides_goodput(*i) && Latency::of(slo).is_some())
        .map(|(_, slo)| (MIN_TAIL / (1.0 - slo.objective) - 1e-9).ceil() as u64)
        .max()
        .unwrap_or(MIN_SAMPLES as u64)
        .max(MIN_SAMPLES as u64)
}

/// Per latency SLO and concurrency band [c, 2c): what was observed and what the model says
/// (the model drawn up to twice `knee`).
pub fn bands<'a>(
    samples: &[Sample],
    set: &SloSet,
    knee: f64,
    model_of: impl Fn(Latency) -> Option<&'a LatencyModel>,
) -> Vec<Band> {
    let mut bands = Vec::new();
    for slo in &set.slos {
        let Some((kind, threshold)) = Latency::of(slo) else {
            continue;
        };
        let mut per_band: Vec<Vec<f64>> = vec![Vec::new(); TOP_BAND.ilog2() as usize + 1];
        for (load, value) in samples.iter().filter_map(|s| kind.point(s)) {
            let band = (load.max(1.0).log2().floor() as usize).min(per_band.len() - 1);
            per_band[band].push(value);
        }
        let model = model_of(kind);
        // The model is drawn up to twice the knee, the observations wherever there are some.
        let reach = if knee.is_finite() { 2.0 * knee } else { 0.0 };
        for (i, values) in per_band.iter_mut().enumerate() {
            let c = 1u64 << i;
            let observed = values.len() as u64 >= set.min_events.max(1);
            if !observed && (c as f64) > reach {
                continue;
            }
            values.sort_by(f64::total_cmp);
            let (attainment, observed_ratio) = if observed {
                let good = values.iter().filter(|v| **v <= threshold).count();
                (
                    good as f64 / values.len() as f64,
                    nearest_rank(values, slo.objective) / threshold,
                )
            } else {
                (f64::NAN, f64::NAN)
            };
            let centre = c as f64 * std::f64::consts::SQRT_2;
            bands.push(Band {
                slo: slo.name.to_string(),
                concurrency: c,
                attainment,
                observed_ratio,
                model_ratio: model.map_or(f64::NAN, |m| m.quantile_at(centre, slo.objective) / threshold),
            });
        }
    }
    bands
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::slo::spec::SloFile;
    use rand::{Rng, SeedableRng};

    /// The SLO set of `yaml`.
    pub(crate) fn set(yaml: &str) -> SloSet {
        let file: SloFile = serde_yaml::from_str(yaml).unwrap();
        SloSet::validate(None, None, Some(20), file).unwrap()
    }

    /// Requests at loads spread over `loads`, TPOT = (10 ms + 0.5 ms × load) × (1 + `noise`),
    /// TTFT = 20 ms × e^(0.02 × load), 32 output tokens.
    pub(crate) fn samples(
        n: usize,
        loads: std::ops::Range<f32>,
        noise: impl Fn(&mut rand::rngs::SmallRng) -> f32,
    ) -> Vec<Sample> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        (0..n)
            .map(|_| {
                let load = if loads.is_empty() {
                    loads.start
                } else {
                    rng.random_range(loads.clone())
                };
                let tpot = (0.010 + 0.0005 * load) * (1.0 + noise(&mut rng));
                Sample {
                    arrival_load: load,
                    decode_load: load,
                    whole_load: load,
                    decode_arrivals: f32::NAN,
                    ttft: 0.020 * (0.02 * load).exp(),
                    tpot,
                    e2e: 0.020 + 31.0 * tpot,
                    output_tokens: 32.0,
                }
            })
            .collect()
    }

    #[test]
    fn the_tail_of_the_tightest_deciding_objective_sets_the_requests_needed() {
        let set = |yaml: &str| SloSet::validate(None, None, None, serde_yaml::from_str(yaml).unwrap()).unwrap();
        let two = set("slos:\n  - {name: a, objective: 99, tpot: 50ms}\n  - {name: b, objective: 99.9, ttft: 1s}\n");
        assert_eq!(requests_to_see_tail(&two), 5000);
        let deciding = set(
            "slos:\n  - {name: a, objective: 99, tpot: 50ms}\n  - {name: b, objective: 99.9, ttft: 1s}\n\
             goodput: {require: [a]}\n",
        );
        assert_eq!(requests_to_see_tail(&deciding), 500);
        let loose = set("slos:\n  - {name: a, objective: 90, tpot: 50ms}\n");
        assert_eq!(
            requests_to_see_tail(&loose),
            MIN_SAMPLES as u64,
            "never fewer than a fit needs"
        );
    }

    #[test]
    fn an_exact_line_predicts_every_request_at_any_load() {
        let tpot = LatencyModel::fit(Latency::Tpot, &samples(500, 4.0..20.0, |_| 0.0)).unwrap();
        assert!((tpot.line().base - 0.010).abs() < 1e-8 && (tpot.line().slope - 0.0005).abs() < 1e-8);
        assert!((tpot.quantile_at(40.0, 0.5) - 0.030).abs() < 1e-8);
        assert_eq!(tpot.attainment_at(39.9, 0.0, 0.030), 1.0);
        assert_eq!(tpot.attainment_at(40.1, 0.0, 0.030), 0.0);
        assert_eq!(tpot.stall(), 0.0, "no arrival rate seen");
        // TTFT: 20 ms × e^(0.02 c) reaches 200 ms at c = ln(10) / 0.02 ≈ 115.
        let ttft = LatencyModel::fit(Latency::Ttft, &samples(500, 4.0..20.0, |_| 0.0)).unwrap();
        assert!((ttft.quantile_at(115.13, 0.5) - 0.200).abs() < 1e-4);
        assert_eq!(ttft.attainment_at(115.0, 0.0, 0.200), 1.0);
        assert_eq!(ttft.attainment_at(115.3, 0.0, 0.200), 0.0);
    }

    #[test]
    fn the_spread_moves_with_the_line() {
        // Noise uniform in [0, +20 %] of TPOT: 95 % of requests within 1.19 × the line.
        let model = LatencyModel::fit(
            Latency::Tpot,
            &samples(4000, 4.0..20.0, |rng| rng.random_range(0.0..0.2)),
        )
        .unwrap();
        let p95 = model.quantile_at(40.0, 0.95);
        assert!((p95 / 0.030 - 1.19).abs() < 0.02, "{p95}");
        let half = model.attainment_at(40.0, 0.0, 1.10 * 0.030);
        assert!((half - 0.5).abs() < 0.05, "{half}");
        assert!(model.sees_tail_of(0.99) && !model.sees_tail_of(0.9999));
    }

    #[test]
    fn prefills_beside_the_decode_are_a_stall_in_the_arrival_rate() {
        // Each arrival per step costs 9.6 ms of the step: TPOT = (10 ms + 0.5 ms × load) /
        // (1 − 0.0096 × arrivals per second), with load and arrivals varying apart.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(8);
        let window: Vec<Sample> = samples(2000, 2.0..25.0, |_| 0.0)
            .into_iter()
            .map(|s| {
                let rate: f32 = rng.random_range(2.0..25.0);
                Sample {
                    decode_arrivals: rate,
                    tpot: (0.010 + 0.0005 * s.decode_load) / (1.0 - 0.0096 * rate),
                    ..s
                }
            })
            .collect();
        let tpot = LatencyModel::fit(Latency::Tpot, &window).unwrap();
        assert!((tpot.stall() - 0.0096).abs() < 1e-6, "{}", tpot.stall());
        assert!((tpot.line().slope - 0.0005).abs() < 1e-8);
        // At 40 in flight and 19 arrivals a second, TPOT is 30 ms / 0.8176.
        let at_knee = 0.030 / (1.0 - 0.0096 * 19.0);
        assert_eq!(tpot.attainment_at(40.0, 19.0, at_knee * 1.001), 1.0);
        assert_eq!(tpot.attainment_at(40.0, 19.0, at_knee * 0.999), 0.0);
        // Without an arrival rate varying apart from the load, no stall is claimed.
        let plain = LatencyModel::fit(Latency::Tpot, &samples(2000, 2.0..25.0, |_| 0.0)).unwrap();
        assert_eq!(plain.stall(), 0.0);
    }

    #[test]
    fn no_model_without_enough_requests_or_spread() {
        let fit = |samples: &[Sample]| LatencyModel::fit(Latency::Tpot, samples);
        assert!(fit(&samples(MIN_SAMPLES - 1, 4.0..20.0, |_| 0.0)).is_none());
        assert!(
            fit(&samples(2000, 10.0..11.5, |_| 0.0)).is_none(),
            "too little spread in load"
        );
        assert!(fit(&samples(2000, 10.0..10.0, |_| 0.0)).is_none(), "constant load");
        // Noise that hides the slope: the slope is not known to within a quarter.
        assert!(fit(&samples(200, 4.0..7.0, |rng| rng.random_range(0.0..3.0))).is_none());
    }

    #[test]
    fn bands_show_what_was_observed_and_what_the_model_says() {
        let window = samples(1000, 4.0..20.0, |_| 0.0);
        let tpot = LatencyModel::fit(Latency::Tpot, &window);
        let bands = bands(&window, &set(TPOT_95), 40.0, |_| tpot.as_ref());
        let edges: Vec<u64> = bands.iter().map(|b| b.concurrency).collect();
        assert_eq!(
            edges,
            [1, 2, 4, 8, 16, 32, 64],
            "observed 4–16, modelled up to twice the knee"
        );
        let band = |c: u64| bands.iter().find(|b| b.concurrency == c).unwrap();
        assert_eq!(band(8).attainment, 1.0);
        assert!(band(2).attainment.is_nan() && band(64).observed_ratio.is_nan());
        assert!(band(32).model_ratio > 1.0 && band(16).model_ratio < 1.0);
    }

    /// One TPOT SLO: 95 % within 30 ms.
    pub(crate) const TPOT_95: &str = "slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n";
}
