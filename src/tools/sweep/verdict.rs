//! The verdict of a comparison, from request-level data that knows its noise.
//!
//! A and B ran the same requests at the same loads, interleaved: each load and repetition is
//! a stratum holding one run of each. For every figure (each SLO's attainment over all loads,
//! p99 TTFT and p99 TPOT averaged over the runs, and the knee) the difference B − A gets
//! - a bootstrap confidence interval: each run's requests are resampled in blocks of
//!   consecutive requests (requests that share a batch are not independent), runs and loads
//!   kept as they are;
//! - a permutation p-value: the labels A and B are swapped within each stratum, all ways or
//!   [`PERMUTATIONS`] random ones; under "no difference" the two runs of a stratum are
//!   exchangeable, however correlated the requests inside a run are.
//!
//! A figure differs when its interval, at 1 − α/m, excludes zero *and* its p-value is below
//! α/m (α = 5 %, m the figures compared: Bonferroni). Otherwise there is no measurable
//! difference. So an A/A comparison says "no difference" at least 95 % of the time.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The family-wise false-alarm rate.
pub const ALPHA: f64 = 0.05;
/// Bootstrap resamples.
pub const RESAMPLES: usize = 1000;
/// Random relabellings, when there are more ways to relabel than this.
pub const PERMUTATIONS: usize = 2000;

/// Most SLOs a comparison judges (the first ones of the file).
pub const MAX_SLOS: usize = 64;

/// One request, as the verdict sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// Time to first token, seconds, when one came.
    pub ttft: Option<f64>,
    /// Time per output token, seconds, when measured.
    pub tpot: Option<f64>,
    /// Bit `i` set: SLO `i` (file order) counted the request.
    pub counted: u64,
    /// Bit `i` set: SLO `i` found it good.
    pub good: u64,
}

/// One target's run at one load and repetition, its requests in the order they were sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The load's index in the ascending list of loads.
    pub step: usize,
    /// The repetition.
    pub repetition: usize,
    /// The requests.
    pub requests: Vec<Observation>,
}

/// What the runs are judged against.
#[derive(Debug, Clone, PartialEq)]
pub struct Judging {
    /// The loads, ascending (requests per second or clients).
    pub loads: Vec<f64>,
    /// Each SLO: its name, objective (0.99) and whether it decides the knee.
    pub slos: Vec<(String, f64, bool)>,
}

/// One figure compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// What is compared (`attainment tpot-50ms`, `p99 TTFT`, `p99 TPOT`, `knee`).
    pub figure: String,
    /// A's value.
    pub a: f64,
    /// B's value.
    pub b: f64,
    /// B − A.
    pub difference: f64,
    /// The bootstrap interval of B − A, at 1 − α/m.
    pub interval: (f64, f64),
    /// The permutation p-value of B − A.
    pub p_value: f64,
    /// Whether B's value is better when higher (attainment, knee) or lower (latency).
    pub higher_is_better: bool,
    /// The verdict: `better`, `worse`, `no measurable difference` (B against A), or `not
    /// measured` when a side lacks the figure.
    pub verdict: &'static str,
}

/// The verdict on every figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Each figure, in order.
    pub differences: Vec<Difference>,
    /// The level of each interval and test (α / m).
    pub level: f64,
    /// Why no difference could be told at all, when none could (too few runs).
    pub caveat: Option<String>,
}

impl Verdict {
    /// One line for people.
    pub fn summary(&self) -> String {
        let differing: Vec<String> = self
            .differences
            .iter()
            .filter(|d| d.differs())
            .map(|d| format!("{} {}", d.figure, d.verdict))
            .collect();
        if differing.is_empty() {
            "verdict: no measurable difference".to_string()
        } else {
            format!("verdict: B differs from A: {}", differing.join(", "))
        }
    }

    /// Whether no figure differs.
    pub fn no_difference(&self) -> bool {
        !self.differences.iter().any(Difference::differs)
    }
}

impl Difference {
    /// B is better or worse by this figure.
    pub fn differs(&self) -> bool {
        self.verdict != NO_DIFFERENCE && self.verdict != NOT_MEASURED
    }
}

/// The words for a figure that does not differ.
pub const NO_DIFFERENCE: &str = "no measurable difference";
/// The words for a figure one side lacks (a knee outside the loads, no latency measured).
pub const NOT_MEASURED: &str = "not measured";

/// A figure's values for one side.
type Figures = Vec<f64>;

/// Compares B's runs with A's, seeded.
pub fn judge(a: &[Run], b: &[Run], judging: &Judging, seed: u64) -> Verdict {
    let names = figure_names(judging);
    let m = names.len() as f64;
    let level = ALPHA / m;
    let (summaries_a, summaries_b) = (summarize_all(a, judging), summarize_all(b, judging));
    let observed_a = figures(&summaries_a.iter().collect::<Vec<_>>(), judging);
    let observed_b = figures(&summaries_b.iter().collect::<Vec<_>>(), judging);
    let mut rng = SmallRng::seed_from_u64(seed);

    // Bootstrap: resample each run's requests in blocks.
    let mut boot: Vec<Vec<f64>> = vec![Vec::with_capacity(RESAMPLES); names.len()];
    let mut scratch = Scratch::default();
    for _ in 0..RESAMPLES {
        let ra: Vec<Summary> = a
            .iter()
            .map(|run| resample(run, &mut rng, judging, &mut scratch))
            .collect();
        let rb: Vec<Summary> = b
            .iter()
            .map(|run| resample(run, &mut rng, judging, &mut scratch))
            .collect();
        let (fa, fb) = (
            figures(&ra.iter().collect::<Vec<_>>(), judging),
            figures(&rb.iter().collect::<Vec<_>>(), judging),
        );
        for (i, values) in boot.iter_mut().enumerate() {
            let d = fb[i] - fa[i];
            if d.is_finite() {
                values.push(d);
            }
        }
    }

    // Permutation: swap A and B within strata. A run's summary moves whole with its label.
    let strata = strata(&summaries_a, &summaries_b);
    let exhaustive = strata.len() < 12;
    let count = if exhaustive {
        1usize << strata.len()
    } else {
        PERMUTATIONS
    };
    let observed: Vec<f64> = observed_b.iter().zip(&observed_a).map(|(b, a)| b - a).collect();
    let mut as_extreme = vec![0usize; names.len()];
    let mut counted = vec![0usize; names.len()];
    for k in 0..count {
        let (mut pa, mut pb): (Vec<&Summary>, Vec<&Summary>) = (Vec::new(), Vec::new());
        for (s, (run_a, run_b)) in strata.iter().enumerate() {
            let swap = if exhaustive {
                k >> s & 1 == 1
            } else {
                rng.random_bool(0.5)
            };
            let (to_a, to_b) = if swap { (*run_b, *run_a) } else { (*run_a, *run_b) };
            pa.push(to_a);
            pb.push(to_b);
        }
        let (fa, fb) = (figures(&pa, judging), figures(&pb, judging));
        for i in 0..names.len() {
            let d = fb[i] - fa[i];
            if d.is_finite() && observed[i].is_finite() {
                counted[i] += 1;
                if d.abs() >= observed[i].abs() - 1e-12 {
                    as_extreme[i] += 1;
                }
            }
        }
    }

    let min_p = if exhaustive {
        2.0 / count as f64
    } else {
        1.0 / (count as f64 + 1.0)
    };
    let caveat = (min_p >= level).then(|| {
        format!(
            "{} runs a side cannot show a difference at the {:.2} % level: add loads or --repetitions",
            strata.len(),
            level * 100.0
        )
    });
    let differences = names
        .into_iter()
        .enumerate()
        .map(|(i, (figure, higher_is_better))| {
            let interval = percentile_interval(&mut boot[i], level);
            let p_value = if counted[i] == 0 {
                f64::NAN
            } else if exhaustive {
                as_extreme[i] as f64 / counted[i] as f64
            } else {
                (as_extreme[i] as f64 + 1.0) / (counted[i] as f64 + 1.0)
            };
            let difference = observed[i];
            let clear = (interval.0 > 0.0 || interval.1 < 0.0) && p_value < level;
            let verdict = match (difference.is_finite(), clear, (difference > 0.0) == higher_is_better) {
                (false, _, _) => NOT_MEASURED,
                (true, false, _) => NO_DIFFERENCE,
                (true, true, true) => "better",
                (true, true, false) => "worse",
            };
            Difference {
                figure,
                a: observed_a[i],
                b: observed_b[i],
                difference,
                interval,
                p_value,
                higher_is_better,
                verdict,
            }
        })
        .collect();
    Verdict {
        differences,
        level,
        caveat,
    }
}

/// The figures compared, and whether higher is better for each.
fn figure_names(judging: &Judging) -> Vec<(String, bool)> {
    let mut names: Vec<(String, bool)> = judging
        .slos
        .iter()
        .map(|(name, _, _)| (format!("attainment {name}"), true))
        .collect();
    names.push(("p99 TTFT".into(), false));
    names.push(("p99 TPOT".into(), false));
    names.push(("knee".into(), true));
    names
}

/// What the figures need of one run: its SLOs' (good, counted) and its p99 TTFT and TPOT.
#[derive(Debug, Clone)]
struct Summary {
    step: usize,
    repetition: usize,
    counts: Vec<(u64, u64)>,
    ttft_p99: f64,
    tpot_p99: f64,
}

/// Reusable buffers for the latencies of one run.
#[derive(Default)]
struct Scratch {
    ttft: Vec<f64>,
    tpot: Vec<f64>,
}

fn summarize_all(runs: &[Run], judging: &Judging) -> Vec<Summary> {
    let mut scratch = Scratch::default();
    runs.iter()
        .map(|run| summarize(run.step, run.repetition, &run.requests, judging, &mut scratch))
        .collect()
}

/// One run's summary, from its requests.
fn summarize<'a>(
    step: usize,
    repetition: usize,
    requests: impl IntoIterator<Item = &'a Observation>,
    judging: &Judging,
    scratch: &mut Scratch,
) -> Summary {
    let slos = judging.slos.len();
    let mut counts = vec![(0u64, 0u64); slos];
    scratch.ttft.clear();
    scratch.tpot.clear();
    for request in requests {
        for (s, count) in counts
            .iter_mut()
            .enumerate()
            .filter(|(s, _)| request.counted >> s & 1 == 1)
        {
            *count = (count.0 + (request.good >> s & 1), count.1 + 1);
        }
        scratch.ttft.extend(request.ttft);
        scratch.tpot.extend(request.tpot);
    }
    Summary {
        step,
        repetition,
        counts,
        ttft_p99: p99(&mut scratch.ttft),
        tpot_p99: p99(&mut scratch.tpot),
    }
}

/// One side's figures over its runs: each SLO's attainment (all loads pooled), p99 TTFT and
/// TPOT (each run's, averaged over the runs: every run weighs the same, and one run's tail
/// does not decide a load's), and the knee interpolated between loads (NaN when outside them).
fn figures(runs: &[&Summary], judging: &Judging) -> Figures {
    let slos = judging.slos.len();
    let steps = judging.loads.len();
    let mut pooled = vec![(0u64, 0u64); slos];
    let mut per_step = vec![vec![(0u64, 0u64); slos]; steps];
    for run in runs {
        for (s, (good, valid)) in run.counts.iter().enumerate() {
            pooled[s] = (pooled[s].0 + good, pooled[s].1 + valid);
            let c = &mut per_step[run.step][s];
            *c = (c.0 + good, c.1 + valid);
        }
    }
    let ttft: Vec<f64> = runs.iter().map(|r| r.ttft_p99).collect();
    let tpot: Vec<f64> = runs.iter().map(|r| r.tpot_p99).collect();
    let ratio = |(good, valid): (u64, u64)| {
        if valid == 0 {
            f64::NAN
        } else {
            good as f64 / valid as f64
        }
    };
    let mut out: Figures = pooled.into_iter().map(ratio).collect();
    out.push(mean(&ttft));
    out.push(mean(&tpot));
    let margins: Vec<f64> = per_step
        .iter()
        .map(|counts| {
            judging
                .slos
                .iter()
                .zip(counts)
                .filter(|((_, _, decides), _)| *decides)
                .map(|((_, objective, _), count)| ratio(*count) - objective)
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    out.push(interpolated_knee(&judging.loads, &margins));
    out
}

/// Where the smallest margin (attainment − objective) of the deciding SLOs first crosses
/// zero, interpolated between the loads; NaN when it never does or fails at the first load.
pub fn interpolated_knee(loads: &[f64], margins: &[f64]) -> f64 {
    let failing = |m: &f64| m.is_nan() || *m < 0.0;
    if margins.first().is_none_or(failing) {
        return f64::NAN;
    }
    match margins.iter().position(failing) {
        None => f64::NAN,
        Some(k) if margins[k].is_nan() => loads[k - 1],
        Some(k) => {
            let (above, below) = (margins[k - 1], margins[k]);
            loads[k - 1] + (loads[k] - loads[k - 1]) * above / (above - below)
        }
    }
}

/// The mean of `values` (NaN when one is NaN or there are none).
fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The 99th percentile (nearest rank), NaN without values.
fn p99(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let rank = ((0.99 * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
    *values.select_nth_unstable_by(rank, f64::total_cmp).1
}

/// The summary of a run's requests resampled in blocks of about √n consecutive requests.
fn resample(run: &Run, rng: &mut SmallRng, judging: &Judging, scratch: &mut Scratch) -> Summary {
    let n = run.requests.len();
    let block = ((n as f64).sqrt().round() as usize).max(1);
    let mut blocks = Vec::with_capacity(n / block + 1);
    let mut drawn = 0;
    while drawn < n {
        let start = rng.random_range(0..n.saturating_sub(block) + 1);
        let end = (start + block).min(n).min(start + n - drawn);
        blocks.push(&run.requests[start..end]);
        drawn += end - start;
    }
    summarize(run.step, run.repetition, blocks.into_iter().flatten(), judging, scratch)
}

/// Each stratum's pair of runs (the same load and repetition).
fn strata<'a>(a: &'a [Summary], b: &'a [Summary]) -> Vec<(&'a Summary, &'a Summary)> {
    a.iter()
        .filter_map(|run_a| {
            b.iter()
                .find(|run_b| run_b.step == run_a.step && run_b.repetition == run_a.repetition)
                .map(|run_b| (run_a, run_b))
        })
        .collect()
}

/// The central 1 − `level` percentile interval of `values` (NaNs when empty).
fn percentile_interval(values: &mut [f64], level: f64) -> (f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((q * (values.len() - 1) as f64).round() as usize).min(values.len() - 1)];
    (at(level / 2.0), at(1.0 - level / 2.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_distr::{Distribution, LogNormal};

    fn judging() -> Judging {
        Judging {
            loads: vec![1.0, 2.0, 3.0, 4.0],
            slos: vec![("tpot".into(), 0.9, true)],
        }
    }

    /// Runs whose TPOT is lognormal around `median × (1 + 0.3 × step)`, judged against 50 ms,
    /// with a run-wide shift (correlated requests) drawn per run.
    fn runs(median: f64, seed: u64, repetitions: usize) -> Vec<Run> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = Vec::new();
        for step in 0..4 {
            for repetition in 0..repetitions {
                let shift = 1.0 + 0.03 * (rng.random::<f64>() - 0.5);
                let spread = LogNormal::new(0.0, 0.25).unwrap();
                let requests = (0..100)
                    .map(|_| {
                        let tpot = median * (1.0 + 0.3 * step as f64) * shift * spread.sample(&mut rng);
                        Observation {
                            ttft: Some(tpot * 10.0),
                            tpot: Some(tpot),
                            counted: 1,
                            good: u64::from(tpot <= 0.05),
                        }
                    })
                    .collect();
                out.push(Run {
                    step,
                    repetition,
                    requests,
                });
            }
        }
        out
    }

    #[test]
    fn the_knee_is_interpolated_where_the_margin_crosses_zero() {
        let loads = [1.0, 2.0, 4.0];
        assert_eq!(interpolated_knee(&loads, &[0.1, 0.05, -0.05]), 3.0);
        assert!(interpolated_knee(&loads, &[0.1, 0.1, 0.1]).is_nan(), "above every load");
        assert!(
            interpolated_knee(&loads, &[-0.1, 0.1, 0.1]).is_nan(),
            "below every load"
        );
        assert_eq!(interpolated_knee(&loads, &[0.0, -0.1, -0.2]), 1.0);
    }

    #[test]
    fn a_against_a_says_no_difference_and_a_slower_b_is_told_apart() {
        // The calibration over many seeds runs on the simulator (tests/compare.rs).
        let verdict = judge(&runs(0.03, 3, 5), &runs(0.03, 1003, 5), &judging(), 3);
        assert_eq!(verdict.caveat, None);
        assert!(verdict.no_difference(), "{verdict:?}");
        assert_eq!(verdict.summary(), "verdict: no measurable difference");
        let verdict = judge(&runs(0.03, 1, 5), &runs(0.0345, 2, 5), &judging(), 9);
        let tpot = verdict.differences.iter().find(|d| d.figure == "p99 TPOT").unwrap();
        assert_eq!(tpot.verdict, "worse", "{verdict:?}");
        assert!(tpot.interval.0 > 0.0 && tpot.p_value < verdict.level);
        let knee = verdict.differences.iter().find(|d| d.figure == "knee").unwrap();
        assert_eq!(knee.verdict, "worse", "{knee:?}");
        assert!(
            verdict.summary().starts_with("verdict: B differs from A: "),
            "{}",
            verdict.summary()
        );
    }

    #[test]
    fn a_knee_beyond_the_loads_is_not_measured_and_not_a_difference() {
        // Every request is good at every load: neither side has a knee among them.
        let verdict = judge(&runs(0.001, 1, 3), &runs(0.001, 2, 3), &judging(), 1);
        let knee = verdict.differences.iter().find(|d| d.figure == "knee").unwrap();
        assert_eq!(knee.verdict, NOT_MEASURED);
        assert!(knee.p_value.is_nan() && !knee.differs());
        assert!(verdict.no_difference());
    }

    #[test]
    fn too_few_runs_say_so() {
        let one = |seed| {
            runs(0.03, seed, 1)
                .into_iter()
                .filter(|r| r.step < 2)
                .collect::<Vec<_>>()
        };
        let verdict = judge(&one(1), &one(2), &judging(), 0);
        assert!(verdict
            .caveat
            .as_deref()
            .unwrap()
            .starts_with("2 runs a side cannot show a difference"));
        assert!(verdict.no_difference());
    }
}
