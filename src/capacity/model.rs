//! The latency–load model of one model's recent requests, and what it says:
//! each latency SLO's capacity solved at its objective's quantile, the knee, the goodput
//! there, and the empirical view per concurrency band.
//!
//! TPOT and e2e are fitted as straight lines in load: a decode step's cost grows about
//! linearly with the running set. TTFT is fitted as a straight line in log space, an
//! exponential in load: it is convex, so it follows the upward bend queueing gives near
//! saturation, and where the data is still linear it extrapolates towards scaling early
//! rather than late. Each SLO is solved at its objective's quantile: the line plus the
//! residuals' quantile at the objective, not the mean.

use super::fit::{robust_line, LineFit};
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

/// What the model can say about one SLO's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Capacity {
    /// The highest concurrency at which the SLO's objective still holds.
    Known(f64),
    /// It holds beyond the farthest the model extrapolates: not the tightest limit.
    Beyond,
    /// Too few requests, too little spread in load, or no clear slope.
    Unknown,
}

impl Capacity {
    /// The gauge value: +Inf beyond reach (no limit the data can see), NaN when unknown.
    pub fn value(self) -> f64 {
        match self {
            Capacity::Known(c) => c,
            Capacity::Beyond => f64::INFINITY,
            Capacity::Unknown => f64::NAN,
        }
    }
}

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

/// One latency fitted against load, over the window's samples.
#[derive(Debug, Clone)]
pub struct LatencyModel {
    kind: Latency,
    fit: LineFit,
    /// The 90th percentile of the load the samples met.
    load_p90: f64,
    samples: usize,
}

impl LatencyModel {
    /// Fits `kind` over `samples`; `None` when they cannot support a model: fewer than
    /// [`MIN_SAMPLES`], load spread under [`MIN_LOAD_SPREAD`], or a slope that is not
    /// positive within [`MAX_SLOPE_ERROR`].
    pub fn fit(kind: Latency, samples: &[Sample]) -> Option<Self> {
        let points: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|s| kind.point(s))
            .map(|(load, value)| {
                (
                    load,
                    if kind.logarithmic() {
                        value.max(1e-6).ln()
                    } else {
                        value
                    },
                )
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
        let fit = robust_line(&points)?;
        if !(fit.slope > 0.0 && fit.slope_error <= MAX_SLOPE_ERROR * fit.slope) {
            return None;
        }
        Some(Self {
            kind,
            fit,
            load_p90: p90,
            samples: points.len(),
        })
    }

    /// The fitted line (in log space for TTFT).
    pub fn line(&self) -> &LineFit {
        &self.fit
    }

    /// The latency at quantile `q` at concurrency `load`.
    pub fn quantile_at(&self, load: f64, q: f64) -> f64 {
        self.unlog(self.fit.at(load) + self.fit.residual_quantile(q))
    }

    /// The typical (fitted) latency at concurrency `load`.
    pub fn typical_at(&self, load: f64) -> f64 {
        self.unlog(self.fit.at(load))
    }

    /// The highest concurrency at which the `q` quantile stays within `threshold`.
    pub fn capacity(&self, threshold: f64, q: f64) -> Capacity {
        let needed = (MIN_TAIL / (1.0 - q)).ceil() as usize;
        if self.samples < needed.max(MIN_SAMPLES) {
            return Capacity::Unknown;
        }
        let target = if self.kind.logarithmic() {
            threshold.ln()
        } else {
            threshold
        };
        let load = (target - self.fit.base - self.fit.residual_quantile(q)) / self.fit.slope;
        if load > MAX_EXTRAPOLATION * self.load_p90 {
            Capacity::Beyond
        } else {
            Capacity::Known(load.max(0.0))
        }
    }

    fn unlog(&self, value: f64) -> f64 {
        if self.kind.logarithmic() {
            value.exp()
        } else {
            value
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

/// Everything the model says about one model's pod, at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Each latency SLO's capacity (+Inf beyond reach, NaN when unknown), in SLO order.
    pub capacity: Vec<(String, f64)>,
    /// The knee: the lowest capacity among the required latency SLOs.
    pub knee: f64,
    /// The latency and objective of the SLO that sets the knee (the first required latency
    /// SLO while the knee is unknown): the load that counts is read in its terms.
    pub binding: Option<(Latency, f64)>,
    /// Goodput requests per second at the knee (Little's law: knee / e2e there).
    pub goodput_requests_per_second: f64,
    /// Goodput output tokens per second at the knee.
    pub goodput_output_tokens_per_second: f64,
    /// TPOT's fitted base (seconds).
    pub tpot_base: f64,
    /// TPOT's fitted cost per request in flight (seconds).
    pub tpot_per_request: f64,
    /// TPOT's fit quality (0–1).
    pub fit_ratio: f64,
    /// Per latency SLO and concurrency band.
    pub bands: Vec<Band>,
}

/// Estimates the capacity of a pod from its window's `samples`, for the SLOs of `set`.
pub fn estimate(samples: &[Sample], set: &SloSet) -> Estimate {
    let ttft = LatencyModel::fit(Latency::Ttft, samples);
    let tpot = LatencyModel::fit(Latency::Tpot, samples);
    let e2e = LatencyModel::fit(Latency::E2e, samples);
    let model_of = |kind| match kind {
        Latency::Ttft => ttft.as_ref(),
        Latency::Tpot => tpot.as_ref(),
        Latency::E2e => e2e.as_ref(),
    };
    let mut capacity = Vec::new();
    let mut required = Vec::new();
    for (i, slo) in set.slos.iter().enumerate() {
        let Some((kind, threshold)) = Latency::of(slo) else {
            continue;
        };
        let c = model_of(kind).map_or(Capacity::Unknown, |m| m.capacity(threshold, slo.objective));
        capacity.push((slo.name.clone(), c.value()));
        if set.decides_goodput(i) {
            required.push((c, (kind, slo.objective)));
        }
    }
    let (knee, binding) = knee(&required);
    let goodput_requests_per_second = match &e2e {
        Some(m) if knee.is_finite() && m.typical_at(knee) > 0.0 => knee / m.typical_at(knee),
        _ => f64::NAN,
    };
    let tokens: Vec<f64> = samples
        .iter()
        .map(|s| f64::from(s.output_tokens))
        .filter(|n| n.is_finite())
        .collect();
    let mean_tokens = tokens.iter().sum::<f64>() / tokens.len() as f64;
    let line = tpot.as_ref().map(LatencyModel::line);
    Estimate {
        capacity,
        knee,
        binding,
        goodput_requests_per_second,
        goodput_output_tokens_per_second: goodput_requests_per_second * mean_tokens,
        tpot_base: line.map_or(f64::NAN, |l| l.base),
        tpot_per_request: line.map_or(f64::NAN, |l| l.slope),
        fit_ratio: line.map_or(f64::NAN, |l| l.fit_ratio),
        bands: bands(samples, set, knee, model_of),
    }
}

/// The knee and the SLO that sets it: the tightest known capacity, unless one required SLO
/// is unknown (then NaN, bound by the first required SLO).
fn knee<T: Copy>(required: &[(Capacity, T)]) -> (f64, Option<T>) {
    let first = required.first().map(|r| r.1);
    let mut tightest = (f64::INFINITY, first);
    for (c, slo) in required {
        match c {
            Capacity::Unknown => return (f64::NAN, first),
            Capacity::Known(c) if *c < tightest.0 => tightest = (*c, Some(*slo)),
            Capacity::Known(_) | Capacity::Beyond => {}
        }
    }
    if tightest.0.is_finite() {
        tightest
    } else {
        (f64::NAN, first)
    }
}

fn bands<'a>(
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
                slo: slo.name.clone(),
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
mod tests {
    use super::*;
    use crate::slo::spec::SloFile;
    use rand::{Rng, SeedableRng};

    fn set(yaml: &str) -> SloSet {
        let file: SloFile = serde_yaml::from_str(yaml).unwrap();
        SloSet::validate(None, None, Some(20), file).unwrap()
    }

    /// Requests at loads spread over `loads`, TPOT = 10 ms + 0.5 ms × load + `noise`,
    /// TTFT = 20 ms × e^(0.02 × load).
    fn samples(n: usize, loads: std::ops::Range<f32>, noise: impl Fn(&mut rand::rngs::SmallRng) -> f32) -> Vec<Sample> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        (0..n)
            .map(|_| {
                let load = if loads.is_empty() {
                    loads.start
                } else {
                    rng.random_range(loads.clone())
                };
                let tpot = 0.010 + 0.0005 * load + noise(&mut rng);
                Sample {
                    arrival_load: load,
                    decode_load: load,
                    whole_load: load,
                    ttft: 0.020 * (0.02 * load).exp(),
                    tpot,
                    e2e: 0.020 + 31.0 * tpot,
                    output_tokens: 32.0,
                }
            })
            .collect()
    }

    const TPOT_95: &str = "slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n";

    fn capacity(e: &Estimate, slo: &str) -> f64 {
        e.capacity.iter().find(|(name, _)| name == slo).unwrap().1
    }

    #[test]
    fn the_knee_of_an_exact_line() {
        let e = estimate(&samples(500, 4.0..20.0, |_| 0.0), &set(TPOT_95));
        assert!((capacity(&e, "tpot") - 40.0).abs() < 1e-3, "{e:?}");
        assert!((e.knee - 40.0).abs() < 1e-3);
        assert!((e.tpot_base - 0.010).abs() < 1e-8 && (e.tpot_per_request - 0.0005).abs() < 1e-8);
        // Little's law at the knee: 40 in flight, each 20 ms + 31 × 30 ms.
        assert!((e.goodput_requests_per_second - 40.0 / 0.95).abs() < 1e-3, "{e:?}");
        assert!((e.goodput_output_tokens_per_second - 32.0 * e.goodput_requests_per_second).abs() < 1e-6);
    }

    #[test]
    fn the_capacity_is_solved_at_the_objective_not_the_mean() {
        // Noise uniform in [0, 4 ms]: the 95th percentile sits 3.8 ms above the base line,
        // the mean 2 ms: the knee is (30 − 10 − 3.8) / 0.5 = 32.4, not 36.
        let e = estimate(
            &samples(4000, 4.0..20.0, |rng| rng.random_range(0.0..0.004)),
            &set(TPOT_95),
        );
        assert!((capacity(&e, "tpot") - 32.4).abs() < 1.0, "{e:?}");
    }

    #[test]
    fn ttft_is_fitted_as_an_exponential_in_load() {
        // 20 ms × e^(0.02 c) reaches 200 ms at c = ln(10) / 0.02 ≈ 115.
        let slos = set("slos:\n  - {name: ttft, objective: 99, ttft: 200ms}\n");
        let e = estimate(&samples(1000, 4.0..20.0, |_| 0.0), &slos);
        assert!((capacity(&e, "ttft") - 115.13).abs() < 0.1, "{e:?}");
    }

    #[test]
    fn no_number_without_enough_requests_or_spread() {
        let slos = set(TPOT_95);
        let few = estimate(&samples(MIN_SAMPLES - 1, 4.0..20.0, |_| 0.0), &slos);
        let flat = estimate(&samples(2000, 10.0..11.5, |_| 0.0), &slos);
        let constant = estimate(&samples(2000, 10.0..10.0, |_| 0.0), &slos);
        for e in [few, flat, constant] {
            assert!(capacity(&e, "tpot").is_nan() && e.knee.is_nan(), "{e:?}");
            assert!(e.tpot_base.is_nan() && e.fit_ratio.is_nan() && e.goodput_requests_per_second.is_nan());
        }
        // 99.9 % needs 5,000 requests to see five beyond its quantile.
        let strict = set("slos:\n  - {name: tpot, objective: 99.9, tpot: 30ms}\n");
        assert!(capacity(&estimate(&samples(4000, 4.0..20.0, |_| 0.0), &strict), "tpot").is_nan());
        assert!(capacity(&estimate(&samples(5000, 4.0..20.0, |_| 0.0), &strict), "tpot").is_finite());
        // Noise that hides the slope: the slope is not known to within a quarter.
        let noisy = estimate(&samples(200, 4.0..7.0, |rng| rng.random_range(0.0..0.05)), &slos);
        assert!(noisy.tpot_per_request.is_nan(), "{noisy:?}");
    }

    #[test]
    fn the_knee_is_the_tightest_required_slo_and_far_extrapolations_are_left_out() {
        let slos = set(
            "slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n  - {name: loose, objective: 95, tpot: 10s}\n  \
             - {name: ttft, objective: 99, ttft: 200ms}\n  - {name: up, objective: 99, availability: true}\n\
             goodput: {require: [tpot, loose, ttft, up]}\n",
        );
        let e = estimate(&samples(1000, 4.0..20.0, |_| 0.0), &slos);
        assert_eq!(capacity(&e, "loose"), f64::INFINITY, "beyond 10 × the load seen: {e:?}");
        assert!((e.knee - 40.0).abs() < 1e-3, "tpot binds; ttft allows 115: {e:?}");
        assert_eq!(e.binding, Some((Latency::Tpot, 0.95)));
        let ttft_binds =
            set("slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n  - {name: ttft, objective: 99, ttft: 30ms}\n");
        let ttft_first = estimate(&samples(1000, 4.0..20.0, |_| 0.0), &ttft_binds);
        assert!(ttft_first.knee < 25.0, "{ttft_first:?}");
        assert_eq!(ttft_first.binding, Some((Latency::Ttft, 0.99)));
        assert_eq!(e.capacity.len(), 3, "availability has no capacity");
        // A required SLO the model cannot judge leaves the knee unknown.
        let unjudged =
            set("slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n  - {name: e2e, objective: 99.99, e2e: 5s}\n");
        let e = estimate(&samples(1000, 4.0..20.0, |_| 0.0), &unjudged);
        assert!(e.knee.is_nan() && e.binding == Some((Latency::Tpot, 0.95)), "{e:?}");
    }

    #[test]
    fn bands_show_what_was_observed_and_what_the_model_says() {
        let e = estimate(&samples(1000, 4.0..20.0, |_| 0.0), &set(TPOT_95));
        let edges: Vec<u64> = e.bands.iter().map(|b| b.concurrency).collect();
        assert_eq!(
            edges,
            [1, 2, 4, 8, 16, 32, 64],
            "observed 4–16, modelled up to twice the knee"
        );
        let band = |c: u64| e.bands.iter().find(|b| b.concurrency == c).unwrap();
        assert_eq!(band(8).attainment, 1.0);
        assert!(band(2).attainment.is_nan() && band(64).observed_ratio.is_nan());
        assert!(band(32).model_ratio > 1.0 && band(16).model_ratio < 1.0);
    }
}
