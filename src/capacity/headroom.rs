//! Headroom: how far the engine's recent traffic can grow before the required SLOs' predicted
//! attainment falls to their objectives, found once and read every way (saturation, capacity
//! as a rate and as a concurrency, goodput at the knee).
//!
//! The recent traffic is scaled by a factor s on its arrival rate. Little's law with the
//! fitted e2e line gives the mean in flight at s; each recent request's load moves with it,
//! its distance from the mean growing as a Poisson process's does (√) for the part of the
//! spread Poisson arrivals explain and in proportion for the rest (bursts). Each request's
//! latency is then predicted with the window's whole spread around the fitted line, so the
//! spread of load and the tail of latency each count once. The s* at which the predicted
//! attainment meets the objective is the headroom: saturation is 1 / s*, capacity is s* × the
//! current rate.

use super::meter::Traffic;
use super::model::{bands, Band, Latency, LatencyModel, MAX_EXTRAPOLATION, MIN_SAMPLES};
use super::window::Sample;
use crate::slo::spec::SloSet;
use std::time::Duration;

/// Fewer recent requests than this: the traffic is not scaled (the last capacity stands).
pub const MIN_RECENT: usize = 20;
/// Bisection steps for s*: a relative precision far below the data's.
const BISECTIONS: usize = 40;
/// Each new capacity is blended into the last with this time constant: the traffic's tail
/// over one short span is noisy, the engine's capacity changes slowly.
pub const SMOOTHING: Duration = Duration::from_secs(60);

/// One latency SLO's capacity under the recent traffic's shape (+Inf beyond the farthest the
/// model extrapolates, NaN when unknown).
#[derive(Debug, Clone, PartialEq)]
pub struct SloCapacity {
    /// The SLO.
    pub slo: String,
    /// The highest arrival rate (requests per second) at which its objective still holds.
    pub requests_per_second: f64,
    /// The mean number of generation requests in flight at that rate.
    pub concurrency: f64,
}

/// The engine's capacity: per SLO, and at the knee (the tightest `goodput.require` SLO).
#[derive(Debug, Clone, PartialEq)]
pub struct Capacities {
    /// Each latency SLO's capacity, in SLO order.
    pub slos: Vec<SloCapacity>,
    /// The knee as an arrival rate (NaN when a required SLO is unknown or none has a limit).
    pub knee_requests_per_second: f64,
    /// The mean in flight at the knee.
    pub knee_concurrency: f64,
    /// Requests per second the model expects to meet every required SLO at the knee.
    pub goodput_requests_per_second: f64,
    /// Output tokens per second of those requests.
    pub goodput_output_tokens_per_second: f64,
}

impl Capacities {
    /// These capacities moved from `previous` by the share of [`SMOOTHING`] since; a value
    /// that is or was not finite is taken as it is now.
    fn blended_into(mut self, previous: Previous) -> Self {
        let weight = 1.0 - (-previous.ago.as_secs_f64() / SMOOTHING.as_secs_f64()).exp();
        let blend = |now: &mut f64, before: f64| {
            if now.is_finite() && before.is_finite() {
                *now = before + weight * (*now - before);
            }
        };
        let before = previous.capacities;
        if before.slos.len() == self.slos.len() {
            for (now, before) in self.slos.iter_mut().zip(&before.slos) {
                blend(&mut now.requests_per_second, before.requests_per_second);
                blend(&mut now.concurrency, before.concurrency);
            }
        }
        blend(&mut self.knee_requests_per_second, before.knee_requests_per_second);
        blend(&mut self.knee_concurrency, before.knee_concurrency);
        blend(
            &mut self.goodput_requests_per_second,
            before.goodput_requests_per_second,
        );
        blend(
            &mut self.goodput_output_tokens_per_second,
            before.goodput_output_tokens_per_second,
        );
        self
    }
}

/// Everything the model says about the engine at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Capacity per SLO and at the knee.
    pub capacities: Capacities,
    /// Current arrival rate over the knee rate (1.0 is at the knee; 0 with no traffic).
    pub saturation: f64,
    /// Generation requests arriving per second now.
    pub load_requests_per_second: f64,
    /// Generation requests in flight now (time-weighted mean).
    pub load_concurrency: f64,
    /// TPOT's fitted base (seconds).
    pub tpot_base: f64,
    /// TPOT's fitted cost per request in flight (seconds).
    pub tpot_per_request: f64,
    /// Seconds of each decode step lost per request arriving per second (0: no stall seen).
    pub tpot_stall: f64,
    /// TPOT's fit quality (0–1).
    pub fit_ratio: f64,
    /// Per latency SLO and concurrency band.
    pub bands: Vec<Band>,
}

/// The engine's recent traffic and the requests that finished in it.
#[derive(Debug, Clone, Copy)]
pub struct Recent<'a> {
    /// Arrival rate and mean in flight.
    pub traffic: Traffic,
    /// The successful requests that finished in the same span.
    pub samples: &'a [Sample],
}

/// The capacities estimated `ago` before this estimate.
#[derive(Debug, Clone, Copy)]
pub struct Previous<'a> {
    /// What they were.
    pub capacities: &'a Capacities,
    /// How long ago.
    pub ago: Duration,
}

/// Estimates the engine's capacity from its `window` and `recent` traffic for the SLOs of
/// `set`, blended into the `previous` estimate over [`SMOOTHING`]. When the recent traffic is
/// too thin to scale, the previous capacities stand while the window still holds a model's
/// worth of requests.
pub fn estimate(window: &[Sample], recent: Option<Recent>, set: &SloSet, previous: Option<Previous>) -> Estimate {
    let fit = |kind| LatencyModel::fit(kind, window);
    let (ttft, tpot, e2e) = (fit(Latency::Ttft), fit(Latency::Tpot), fit(Latency::E2e));
    let model_of = |kind| match kind {
        Latency::Ttft => ttft.as_ref(),
        Latency::Tpot => tpot.as_ref(),
        Latency::E2e => e2e.as_ref(),
    };
    let tokens = mean(window.iter().map(|s| f64::from(s.output_tokens)));
    // How fast e2e grows with load: its own line, else TPOT's over the mean output.
    let e2e_slope = match (&e2e, &tpot) {
        (Some(e2e), _) => e2e.line().slope,
        (None, Some(tpot)) => tpot.line().slope * (tokens - 1.0).max(0.0),
        (None, None) => f64::NAN,
    };
    let scaling = recent.and_then(|r| Some((Scaling::new(r, e2e_slope)?, r.samples)));
    let capacities = match (&scaling, previous) {
        (Some((scaling, samples)), previous) => {
            let fresh = solve_all(set, scaling, samples, &model_of, tokens);
            match previous {
                Some(previous) => fresh.blended_into(previous),
                None => fresh,
            }
        }
        (None, Some(previous)) if window.len() >= MIN_SAMPLES => previous.capacities.clone(),
        (None, _) => unknown(set),
    };
    let rate = recent.map_or(0.0, |r| r.traffic.arrival_rate);
    let saturation = if rate > 0.0 {
        rate / capacities.knee_requests_per_second
    } else {
        0.0
    };
    let line = tpot.as_ref().map(LatencyModel::line);
    Estimate {
        saturation,
        load_requests_per_second: rate,
        load_concurrency: recent.map_or(0.0, |r| r.traffic.in_flight),
        tpot_base: line.map_or(f64::NAN, |l| l.base),
        tpot_per_request: line.map_or(f64::NAN, |l| l.slope),
        tpot_stall: tpot.as_ref().map_or(f64::NAN, LatencyModel::stall),
        fit_ratio: line.map_or(f64::NAN, |l| l.fit_ratio),
        bands: bands(window, set, capacities.knee_concurrency, model_of),
        capacities,
    }
}

/// Every capacity NaN: nothing to go on.
fn unknown(set: &SloSet) -> Capacities {
    Capacities {
        slos: set
            .slos
            .iter()
            .filter(|slo| Latency::of(slo).is_some())
            .map(|slo| SloCapacity {
                slo: slo.name.to_string(),
                requests_per_second: f64::NAN,
                concurrency: f64::NAN,
            })
            .collect(),
        knee_requests_per_second: f64::NAN,
        knee_concurrency: f64::NAN,
        goodput_requests_per_second: f64::NAN,
        goodput_output_tokens_per_second: f64::NAN,
    }
}

fn solve_all<'a>(
    set: &SloSet,
    scaling: &Scaling,
    recent: &[Sample],
    model_of: &impl Fn(Latency) -> Option<&'a LatencyModel>,
    tokens: f64,
) -> Capacities {
    let mut slos = Vec::new();
    let mut required = Vec::new();
    for (i, slo) in set.slos.iter().enumerate() {
        let Some((kind, threshold)) = Latency::of(slo) else {
            continue;
        };
        let prediction = model_of(kind).and_then(|model| Prediction::new(model, threshold, scaling, kind, recent));
        let headroom = prediction
            .as_ref()
            .map_or(Headroom::Unknown, |p| p.solve(slo.objective));
        let (requests_per_second, concurrency) = match headroom {
            Headroom::Scale(s) => (
                s * scaling.rate,
                scaling.load_ratio(s).map_or(f64::INFINITY, |r| r * scaling.in_flight),
            ),
            Headroom::Beyond => (f64::INFINITY, f64::INFINITY),
            Headroom::Unknown => (f64::NAN, f64::NAN),
        };
        slos.push(SloCapacity {
            slo: slo.name.to_string(),
            requests_per_second,
            concurrency,
        });
        if set.decides_goodput(i) {
            required.push((headroom, prediction, slos.len() - 1));
        }
    }
    let knee = knee(&required);
    let (knee_requests_per_second, knee_concurrency, goodput) = match knee {
        Some((s, i)) => {
            // The share meeting every required SLO, taking them as independent given load.
            let good: f64 = required.iter().flat_map(|r| &r.1).map(|p| p.attainment(s)).product();
            let knee = &slos[i];
            (
                knee.requests_per_second,
                knee.concurrency,
                knee.requests_per_second * good,
            )
        }
        None => (f64::NAN, f64::NAN, f64::NAN),
    };
    Capacities {
        slos,
        knee_requests_per_second,
        knee_concurrency,
        goodput_requests_per_second: goodput,
        goodput_output_tokens_per_second: goodput * tokens,
    }
}

/// The knee's scale and the index of its SLO: the tightest required SLO; `None` when one of
/// them is unknown or none has a limit the model can see.
fn knee(required: &[(Headroom, Option<Prediction>, usize)]) -> Option<(f64, usize)> {
    let mut tightest: Option<(f64, usize)> = None;
    for (headroom, _, i) in required {
        match headroom {
            Headroom::Unknown => return None,
            Headroom::Scale(s) if tightest.is_none_or(|(t, _)| *s < t) => tightest = Some((*s, *i)),
            Headroom::Scale(_) | Headroom::Beyond => {}
        }
    }
    tightest
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values
        .filter(|v| v.is_finite())
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n as f64
}

/// How far the recent traffic can be scaled for one SLO.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Headroom {
    /// Its objective holds up to this factor on the arrival rate.
    Scale(f64),
    /// It holds beyond the farthest the model extrapolates.
    Beyond,
    /// Too few requests, too little spread in load, or no clear slope.
    Unknown,
}

/// How the recent traffic grows when its arrival rate is scaled by s.
#[derive(Debug, Clone, Copy)]
struct Scaling {
    /// Arrivals per second now.
    rate: f64,
    /// Mean in flight now.
    in_flight: f64,
    /// The share of today's e2e that a request's e2e grows by, per unit of growth in the
    /// load ratio: Little's law gives N = s × rate × e2e, and e2e grows along its line with the
    /// load the requests met, which moves with the load ratio from what they meet today.
    e2e_growth: f64,
    /// The share of the load's variance that Poisson arrivals explain (the rest scales with
    /// the load itself).
    poisson_share: f64,
}

impl Scaling {
    /// The scaling of `recent`; `None` without enough traffic or a finite e2e slope.
    fn new(recent: Recent, e2e_slope: f64) -> Option<Self> {
        let Traffic {
            arrival_rate: rate,
            in_flight,
            ..
        } = recent.traffic;
        if recent.samples.len() < MIN_RECENT || !(rate > 0.0 && in_flight > 0.0) || !e2e_slope.is_finite() {
            return None;
        }
        // Poisson arrivals keep a Poisson count in flight (variance = mean); a rate that varies
        // adds the variance of rate × e2e, e2e being in flight / rate by Little's law.
        let bursts = recent.traffic.rate_variance * (in_flight / rate).powi(2);
        let poisson_share = in_flight / (in_flight + bursts);
        // The others in flight the requests met over their lifetime: the mean in flight for
        // steady arrivals, more when they come in bursts.
        let met = recent
            .samples
            .iter()
            .filter_map(|s| Latency::E2e.load(s))
            .map(|l| (l - 1.0).max(0.0));
        let met = Some(mean(met)).filter(|m| m.is_finite()).unwrap_or(in_flight);
        Some(Self {
            rate,
            in_flight,
            e2e_growth: rate * e2e_slope.max(0.0) * met / in_flight,
            poisson_share,
        })
    }

    /// Mean in flight at scale `s` over now (r = s (1 − x) / (1 − s x), x the e2e growth);
    /// `None` where e2e would grow faster than the requests leave (no steady state).
    fn load_ratio(&self, s: f64) -> Option<f64> {
        let x = self.e2e_growth;
        let room = 1.0 - s * x;
        (room > 0.0 && x < 1.0).then(|| s * (1.0 - x) / room)
    }

    /// The scale at which the mean in flight is `ratio` times today's.
    fn scale_for(&self, ratio: f64) -> f64 {
        let x = self.e2e_growth;
        ratio / (1.0 - x + ratio * x)
    }

    /// How much a request's distance from the mean load grows at load ratio `r`.
    fn spread(&self, r: f64) -> f64 {
        (r * self.poisson_share + r * r * (1.0 - self.poisson_share)).sqrt()
    }
}

/// One SLO's predicted attainment as the recent traffic is scaled.
#[derive(Debug)]
struct Prediction<'a> {
    model: &'a LatencyModel,
    threshold: f64,
    scaling: Scaling,
    /// Each recent request's others in flight, in the SLO's terms.
    others: Vec<f64>,
    /// Each recent request's arrivals per second over its decode (0 where unknown).
    rates: Vec<f64>,
    mean_others: f64,
}

impl<'a> Prediction<'a> {
    /// The prediction for `recent` requests' loads in `kind`'s terms; `None` with too few.
    fn new(
        model: &'a LatencyModel,
        threshold: f64,
        scaling: &Scaling,
        kind: Latency,
        recent: &[Sample],
    ) -> Option<Self> {
        let (others, rates): (Vec<f64>, Vec<f64>) = recent
            .iter()
            .filter_map(|s| {
                let rate = f64::from(s.decode_arrivals);
                Some((
                    (kind.load(s)? - 1.0).max(0.0),
                    if rate.is_finite() { rate } else { 0.0 },
                ))
            })
            .unzip();
        (others.len() >= MIN_RECENT).then(|| Self {
            model,
            threshold,
            scaling: *scaling,
            mean_others: mean(others.iter().copied()),
            others,
            rates,
        })
    }

    /// The share of requests within the threshold at scale `s`.
    fn attainment(&self, s: f64) -> f64 {
        let Some(r) = self.scaling.load_ratio(s) else {
            return 0.0;
        };
        let (centre, spread) = (r * self.mean_others, self.scaling.spread(r));
        let total: f64 = self
            .others
            .iter()
            .zip(&self.rates)
            .map(|(o, rate)| {
                let load = (1.0 + centre + spread * (o - self.mean_others)).max(1.0);
                self.model.attainment_at(load, s * rate, self.threshold)
            })
            .sum();
        total / self.others.len() as f64
    }

    /// The scale at which the attainment meets `objective`.
    fn solve(&self, objective: f64) -> Headroom {
        if !self.model.sees_tail_of(objective) {
            return Headroom::Unknown;
        }
        let farthest = MAX_EXTRAPOLATION * self.model.load_p90() / self.scaling.in_flight;
        let mut high = self.scaling.scale_for(farthest);
        if self.attainment(high) >= objective {
            return Headroom::Beyond;
        }
        let mut low = 0.0;
        if self.attainment(low) < objective {
            return Headroom::Scale(0.0);
        }
        for _ in 0..BISECTIONS {
            let mid = 0.5 * (low + high);
            if self.attainment(mid) >= objective {
                low = mid;
            } else {
                high = mid;
            }
        }
        Headroom::Scale(low)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::model::tests::{samples, set, TPOT_95};
    use rand::{Rng, SeedableRng};

    /// Recent requests that each met `others(i)` others in flight.
    fn recent_with(others: impl Fn(usize) -> f32) -> Vec<Sample> {
        let window = samples(1, 4.0..4.0, |_| 0.0)[0];
        (0..1000)
            .map(|i| {
                let load = 1.0 + others(i);
                Sample {
                    arrival_load: load,
                    decode_load: load,
                    whole_load: load,
                    decode_arrivals: 10.0,
                    ..window
                }
            })
            .collect()
    }

    /// 10 requests a second, 4 in flight (as many as the recent requests met besides themselves).
    fn traffic() -> Traffic {
        Traffic {
            arrival_rate: 10.0,
            in_flight: 4.0,
            rate_variance: 0.0,
            span: Duration::from_secs(20),
        }
    }

    fn run(window: &[Sample], recent: &[Sample], slos: &str) -> Estimate {
        run_in(traffic(), window, recent, slos)
    }

    fn run_in(traffic: Traffic, window: &[Sample], recent: &[Sample], slos: &str) -> Estimate {
        let recent = Recent {
            traffic,
            samples: recent,
        };
        estimate(window, Some(recent), &set(slos), None)
    }

    /// The load ratio r the knee is at, and the scale s it takes: e2e grows 31 × 0.5 ms per
    /// request in flight, so at 10 requests a second s = r / (1 − x + r·x) with x = 0.155.
    fn scale_of(ratio: f64) -> f64 {
        ratio / (1.0 - 0.155 + ratio * 0.155)
    }

    #[test]
    fn steady_traffic_on_an_exact_line_scales_to_the_knee() {
        // Every recent request met 4 others: TPOT reaches 30 ms at 40 in flight, 1 + 4r = 40.
        let e = run(&samples(500, 4.0..20.0, |_| 0.0), &recent_with(|_| 4.0), TPOT_95);
        let (r, c) = (39.0 / 4.0, &e.capacities);
        assert!((c.knee_concurrency - 4.0 * r).abs() < 1e-4, "{c:?}");
        assert!((c.knee_requests_per_second - 10.0 * scale_of(r)).abs() < 1e-4, "{c:?}");
        assert_eq!(c.slos[0].requests_per_second, c.knee_requests_per_second);
        assert_eq!(
            e.saturation,
            10.0 / c.knee_requests_per_second,
            "rate over the knee rate"
        );
        // At the knee at least the objective's share of requests is good.
        let good = c.goodput_requests_per_second / c.knee_requests_per_second;
        assert!((0.95..=1.0).contains(&good), "{c:?}");
        assert!((c.goodput_output_tokens_per_second - 32.0 * c.goodput_requests_per_second).abs() < 1e-6);
        assert!((e.tpot_base - 0.010).abs() < 1e-8 && (e.tpot_per_request - 0.0005).abs() < 1e-8);
        assert_eq!(e.tpot_stall, 0.0, "the arrival rate never varied apart from the load");
    }

    #[test]
    fn poisson_spread_grows_as_its_square_root_and_bursts_in_proportion() {
        let window = samples(500, 4.0..20.0, |_| 0.0);
        // Poisson(4) others: the 95th percentile (8) moves to 4r + 4√r.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let poisson = rand_distr::Poisson::new(4.0).unwrap();
        let draws: Vec<f32> = (0..1000).map(|_| rng.sample(poisson)).collect();
        let e = run(&window, &recent_with(|i| draws[i]), TPOT_95);
        let root = (-4.0 + (16.0f64 + 16.0 * 38.0).sqrt()) / 8.0;
        assert!(
            (e.capacities.knee_concurrency / 4.0 - root * root).abs() < 0.3,
            "{:?}",
            e.capacities
        );
        // On/off: half the requests met none, half met 8, with an arrival rate varying by 75
        // (req/s)²: 75 × (4 / 10)² = 12 of load variance from bursts beside Poisson's 4, so a
        // quarter of the spread is Poisson's and the rest grows with the load; the busy half
        // must fit.
        let varying = Traffic {
            rate_variance: 75.0,
            ..traffic()
        };
        let on_off = recent_with(|i| if i % 2 == 0 { 0.0 } else { 8.0 });
        let bursty = run_in(varying, &window, &on_off, TPOT_95);
        let fits = |r: f64| r + (0.25 * r + 0.75 * r * r).sqrt() <= 9.75;
        let mut r = 0.0;
        while fits(r + 1e-4) {
            r += 1e-4;
        }
        let c = &bursty.capacities;
        assert!((c.knee_concurrency / 4.0 - r).abs() < 0.01, "{c:?} against {r}");
        assert!((c.knee_requests_per_second - 10.0 * scale_of(r)).abs() < 0.05, "{c:?}");
    }

    #[test]
    fn a_noisy_engine_has_less_headroom() {
        // TPOT up to 20 % over its line: 95 % within 1.19 × the line, 30 ms at 30.4 in flight.
        let window = samples(4000, 4.0..20.0, |rng| rng.random_range(0.0..0.2));
        let e = run(&window, &recent_with(|_| 4.0), TPOT_95);
        let r = ((0.030 / 1.19 - 0.010) / 0.0005 - 1.0) / 4.0;
        assert!(
            (e.capacities.knee_concurrency / 4.0 - r).abs() < 0.15,
            "{:?} against {r}",
            e.capacities
        );
    }

    #[test]
    fn the_knee_is_the_tightest_required_slo() {
        let slos =
            "slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n  - {name: loose, objective: 95, tpot: 10s}\n  \
                    - {name: ttft, objective: 99, ttft: 200ms}\n  - {name: up, objective: 99, availability: true}\n\
                    goodput: {require: [tpot, loose, ttft, up]}\n";
        let window = samples(1000, 4.0..20.0, |_| 0.0);
        let e = run(&window, &recent_with(|_| 4.0), slos);
        let c = &e.capacities;
        let names: Vec<&str> = c.slos.iter().map(|s| s.slo.as_str()).collect();
        assert_eq!(names, ["tpot", "loose", "ttft"], "availability has no capacity");
        assert_eq!(
            c.slos[1].requests_per_second,
            f64::INFINITY,
            "beyond 10 x the load seen"
        );
        assert!(
            c.slos[2].concurrency > c.slos[0].concurrency,
            "TTFT allows 115 in flight"
        );
        assert_eq!(c.knee_requests_per_second, c.slos[0].requests_per_second);
        // A required SLO the model cannot judge (99.99 % needs 50,000 requests) leaves the knee
        // unknown; one that fails with no load at all has no capacity.
        let unjudged =
            "slos:\n  - {name: tpot, objective: 95, tpot: 30ms}\n  - {name: e2e, objective: 99.99, e2e: 5s}\n";
        let e = run(&window, &recent_with(|_| 4.0), unjudged);
        assert!(
            e.capacities.knee_requests_per_second.is_nan() && e.saturation.is_nan(),
            "{e:?}"
        );
        let impossible = run(
            &window,
            &recent_with(|_| 4.0),
            "slos:\n  - {name: tpot, objective: 95, tpot: 5ms}\n",
        );
        assert_eq!(impossible.capacities.knee_requests_per_second, 0.0);
        assert_eq!(impossible.saturation, f64::INFINITY);
    }

    #[test]
    fn a_new_capacity_moves_the_last_one_over_a_minute() {
        let window = samples(500, 4.0..20.0, |_| 0.0);
        let recent = recent_with(|_| 4.0);
        let fresh = run(&window, &recent, TPOT_95).capacities;
        let mut low = fresh.clone();
        low.knee_requests_per_second = fresh.knee_requests_per_second / 2.0;
        low.slos[0].requests_per_second = f64::NAN;
        let after = |ago: Duration| {
            let previous = Previous { capacities: &low, ago };
            let at = Recent {
                traffic: traffic(),
                samples: &recent,
            };
            estimate(&window, Some(at), &set(TPOT_95), Some(previous)).capacities
        };
        let minute = after(SMOOTHING);
        let expected = low.knee_requests_per_second + (1.0 - (-1.0f64).exp()) * low.knee_requests_per_second;
        assert!((minute.knee_requests_per_second - expected).abs() < 1e-9, "{minute:?}");
        assert_eq!(minute.slos[0], fresh.slos[0], "an unknown value is replaced outright");
        let long = after(20 * SMOOTHING).knee_requests_per_second;
        assert!((long - fresh.knee_requests_per_second).abs() < 1e-6);
    }

    #[test]
    fn no_number_without_a_model_and_the_last_one_stands_through_thin_traffic() {
        let slos = set(TPOT_95);
        let window = samples(500, 4.0..20.0, |_| 0.0);
        let busy = recent_with(|_| 4.0);
        let thin = &busy[..MIN_RECENT - 1];
        let at = |samples| Recent {
            traffic: traffic(),
            samples,
        };
        let few = estimate(&window[..MIN_SAMPLES - 1], Some(at(&busy)), &slos, None);
        assert!(few.capacities.knee_requests_per_second.is_nan() && few.saturation.is_nan());
        assert!(few.tpot_base.is_nan() && few.capacities.slos[0].concurrency.is_nan());
        let known = estimate(&window, Some(at(&busy)), &slos, None).capacities;
        let unscaled = estimate(&window, Some(at(thin)), &slos, None);
        assert!(unscaled.capacities.knee_requests_per_second.is_nan(), "{unscaled:?}");
        let before = |ago| {
            Some(Previous {
                capacities: &known,
                ago,
            })
        };
        let standing = estimate(&window, Some(at(thin)), &slos, before(Duration::from_secs(5)));
        assert_eq!(standing.capacities, known);
        assert_eq!(standing.saturation, 10.0 / known.knee_requests_per_second);
        let idle = estimate(&window, None, &slos, before(Duration::from_secs(5)));
        assert_eq!((idle.saturation, idle.load_requests_per_second), (0.0, 0.0));
        assert_eq!(idle.capacities, known);
        // Once the window has emptied, the last capacity goes with it.
        let forgotten = estimate(&[], None, &slos, before(Duration::from_secs(5)));
        assert!(forgotten.capacities.knee_requests_per_second.is_nan());
        assert_eq!(forgotten.saturation, 0.0, "no traffic, no saturation");
    }
}
