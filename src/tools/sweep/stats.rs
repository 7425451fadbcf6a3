//! One step's figures from its samples: exact sample quantiles, throughput, each SLO's
//! attainment and goodput, judged with the sidecar's own classification.

use super::client::{Endpoint, Sample};
use super::health::{self, ClientHealth};
use crate::quantile::nearest_rank;
use crate::record::Outcome;
use crate::slo::spec::SloSet;
use crate::slo::{classify, is_goodput, Verdict};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The load a step holds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Load {
    /// Closed loop: this many clients, each sending its next request when the last ends.
    #[serde(rename = "concurrency")]
    Concurrency(usize),
    /// Open loop: Poisson arrivals at this many requests per second.
    #[serde(rename = "rate")]
    Rate(f64),
}

impl Load {
    /// The load as a number: clients, or requests per second.
    pub fn value(self) -> f64 {
        match self {
            Load::Concurrency(c) => c as f64,
            Load::Rate(r) => r,
        }
    }

    /// The unit that follows such a number, for people.
    pub fn unit(self) -> &'static str {
        match self {
            Load::Concurrency(_) => " clients",
            Load::Rate(_) => " req/s",
        }
    }
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Load::Concurrency(c) => write!(f, "c={c}"),
            Load::Rate(r) => {
                // At most three decimals: a trace's own rate has many.
                let rate = format!("{r:.3}");
                write!(f, "{} req/s", rate.trim_end_matches('0').trim_end_matches('.'))
            }
        }
    }
}

/// Mean and exact sample quantiles of one figure, in seconds (NaN without samples).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantiles {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Quantiles {
    /// The mean and nearest-rank quantiles of `values`.
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self {
            mean: mean(&values),
            p50: nearest_rank(&values, 0.50),
            p90: nearest_rank(&values, 0.90),
            p99: nearest_rank(&values, 0.99),
        }
    }
}

/// The arithmetic mean (NaN without values).
fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// How one SLO fared in a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attainment {
    /// The SLO's name.
    pub slo: String,
    /// Its objective as a fraction (0.99).
    pub objective: f64,
    /// Requests it judged.
    pub valid: u64,
    /// Of those, the good ones.
    pub good: u64,
    /// good / valid (NaN when it judged none).
    pub attainment: f64,
    /// Whether it decides the knee (in `goodput.require`, or every SLO when that is empty).
    pub required: bool,
}

/// What a step's requests say about an objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    /// Enough requests, and the objective held.
    Met,
    /// The objective failed: on enough requests, or on so many bad ones that no full sample
    /// could have met it.
    Missed,
    /// Too few requests to tell.
    Unjudged,
    /// The objective failed while the client lagged past its bound: the client, not the
    /// engine, may be what missed it, so the step is not judged.
    ClientLimited,
}

impl Judgement {
    /// The word the report uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Judgement::Met => "meets",
            Judgement::Missed => "misses",
            Judgement::Unjudged => "unjudged",
            Judgement::ClientLimited => "client-limited",
        }
    }
}

/// Fewest events that judge an objective: 5 / (1 − objective), so that five bad events are
/// expected at the objective itself (500 for 99 %, 50 for 90 %, 5000 for 99.9 %).
pub fn events_needed(objective: f64) -> u64 {
    (5.0 / (1.0 - objective) - 1e-9).ceil() as u64
}

impl Attainment {
    /// The events this objective needs to be judged ([`events_needed`]).
    pub fn needed(&self) -> u64 {
        events_needed(self.objective)
    }

    /// Met, missed, or too few events to tell. Below [`Attainment::needed`] a miss is still a
    /// miss when more bad events came than a whole sample of that size may hold.
    pub fn verdict(&self) -> Judgement {
        let needed = self.needed();
        let bad = self.valid - self.good;
        if self.valid >= needed {
            if self.attainment >= self.objective {
                Judgement::Met
            } else {
                Judgement::Missed
            }
        } else if bad as f64 > (1.0 - self.objective) * needed as f64 {
            Judgement::Missed
        } else {
            Judgement::Unjudged
        }
    }
}

/// Everything measured in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    /// The load held.
    pub load: Load,
    /// Length of the measured window, seconds.
    pub window_s: f64,
    /// Requests sent in the window.
    pub requests: u64,
    /// Failed requests by outcome (`upstream_error`, `client_error`, `timeout`, …).
    pub errors: BTreeMap<&'static str, u64>,
    /// The first failure's message for each outcome, to show the user.
    pub error_examples: BTreeMap<&'static str, String>,
    /// Time to first token.
    pub ttft: Quantiles,
    /// Time to the first body bytes: what clients that stamp the first chunk, even a role-only
    /// one, call TTFT (`vllm bench serve` does).
    pub ttfb: Quantiles,
    /// Time per output token.
    pub tpot: Quantiles,
    /// Gaps between token events.
    pub itl: Quantiles,
    /// Whole request.
    pub e2e: Quantiles,
    /// Mean prompt tokens the engine reported (usage), NaN when it reported none.
    pub prompt_tokens_mean: f64,
    /// Mean output tokens per successful request.
    pub output_tokens_mean: f64,
    /// By API: the successful requests whose usage counted fewer output tokens than they
    /// asked for, and all its successful requests that stated their output tokens.
    pub ended_early: BTreeMap<&'static str, (u64, u64)>,
    /// Requests completed per second (see [`throughput`]).
    pub requests_per_second: f64,
    /// Output tokens of successful requests per second.
    pub output_tokens_per_second: f64,
    /// Mean of 1 / TPOT over the requests: the streaming speed one user sees.
    pub per_user_tokens_per_second: f64,
    /// Requests per second meeting every `goodput.require` SLO.
    pub goodput_requests_per_second: f64,
    /// Their output tokens per second.
    pub goodput_output_tokens_per_second: f64,
    /// Each SLO, in file order.
    pub attainment: Vec<Attainment>,
    /// How the client fared, when it was watched.
    pub client: Option<ClientHealth>,
    /// The client lag (p99, seconds) above which a miss is not the engine's ([`health::lag_bound`]).
    pub lag_bound_s: f64,
}

impl StepResult {
    /// The figures of `samples`, the requests sent during a `window` long step at `load`.
    pub fn from_samples(load: Load, window: Duration, samples: &[Sample], slos: &SloSet) -> Self {
        let window_s = window.as_secs_f64();
        let mut errors = BTreeMap::new();
        let mut error_examples = BTreeMap::new();
        let mut counts: Vec<(u64, u64)> = vec![(0, 0); slos.slos.len()];
        let (mut good_requests, mut good_tokens, mut output_tokens) = (0u64, 0u64, 0u64);
        let mut succeeded = 0u64;
        let mut ended_early = BTreeMap::new();
        let (mut ttft, mut tpot, mut itl, mut e2e, mut prompt) = (vec![], vec![], vec![], vec![], vec![]);
        let mut ttfb = vec![];
        let mut busy_s = 0.0;
        for sample in samples {
            busy_s += sample.record.e2e.as_secs_f64();
            let record = &sample.record;
            let verdicts: Vec<Verdict> = slos.slos.iter().map(|slo| classify(slo, record)).collect();
            for (count, verdict) in counts.iter_mut().zip(&verdicts) {
                match verdict {
                    Verdict::Good => *count = (count.0 + 1, count.1 + 1),
                    Verdict::Bad => count.0 += 1,
                    Verdict::NotCounted => {}
                }
            }
            if record.outcome != Outcome::Success {
                *errors.entry(record.outcome.as_str()).or_insert(0) += 1;
                if let Some(message) = &sample.failure {
                    error_examples
                        .entry(record.outcome.as_str())
                        .or_insert_with(|| message.clone());
                }
                continue;
            }
            succeeded += 1;
            if let Some(counted) = record.output_tokens {
                let api = Endpoint::of_operation(record.operation).map_or(record.operation.as_str(), Endpoint::api);
                let entry = ended_early.entry(api).or_insert((0, 0));
                *entry = (
                    entry.0 + u64::from(counted < u64::from(sample.asked_output_tokens)),
                    entry.1 + 1,
                );
            }
            let tokens = record.output_tokens.unwrap_or(0);
            output_tokens += tokens;
            if is_goodput(slos, record, &verdicts) {
                good_requests += 1;
                good_tokens += tokens;
            }
            ttft.extend(record.ttft.map(|d| d.as_secs_f64()));
            ttfb.extend(sample.ttfb.map(|d| d.as_secs_f64()));
            tpot.extend(record.tpot().map(|d| d.as_secs_f64()));
            e2e.push(record.e2e.as_secs_f64());
            itl.extend(sample.gaps.iter().map(Duration::as_secs_f64));
            prompt.extend(record.input_tokens.map(|n| n as f64));
        }
        let per_user: Vec<f64> = tpot.iter().filter(|t| **t > 0.0).map(|t| 1.0 / t).collect();
        let requests_per_second = throughput(load, samples.len(), busy_s, window_s);
        let per_request = |total: u64| {
            if samples.is_empty() {
                0.0
            } else {
                requests_per_second * total as f64 / samples.len() as f64
            }
        };
        let attainment = slos
            .slos
            .iter()
            .enumerate()
            .zip(counts)
            .map(|((i, slo), (valid, good))| Attainment {
                slo: slo.name.to_string(),
                objective: slo.objective,
                valid,
                good,
                attainment: if valid == 0 {
                    f64::NAN
                } else {
                    good as f64 / valid as f64
                },
                required: slos.decides_goodput(i),
            })
            .collect();
        Self {
            load,
            window_s,
            requests: samples.len() as u64,
            errors,
            error_examples,
            ttft: Quantiles::of(ttft),
            ttfb: Quantiles::of(ttfb),
            tpot: Quantiles::of(tpot),
            itl: Quantiles::of(itl),
            e2e: Quantiles::of(e2e),
            prompt_tokens_mean: mean(&prompt),
            ended_early,
            output_tokens_mean: if succeeded == 0 {
                f64::NAN
            } else {
                output_tokens as f64 / succeeded as f64
            },
            requests_per_second,
            output_tokens_per_second: per_request(output_tokens),
            per_user_tokens_per_second: mean(&per_user),
            goodput_requests_per_second: per_request(good_requests),
            goodput_output_tokens_per_second: per_request(good_tokens),
            attainment,
            client: None,
            lag_bound_s: health::lag_bound(slos),
        }
    }

    /// The step with how its client fared.
    pub fn with_client(self, client: ClientHealth) -> Self {
        Self {
            client: Some(client),
            ..self
        }
    }

    /// Whether the client lagged past its bound in this step.
    pub fn client_behind(&self) -> bool {
        self.client.is_some_and(|c| c.behind(self.lag_bound_s))
    }

    /// How far the inter-chunk gaps strayed from the engine's step: ITL p99 over TPOT p50 (NaN
    /// without both). A client that reads late sees long gaps between chunks that the engine
    /// sent a step apart.
    pub fn gap_stray(&self) -> f64 {
        if self.tpot.p50 > 0.0 {
            self.itl.p99 / self.tpot.p50
        } else {
            f64::NAN
        }
    }

    /// Failed requests, all outcomes together.
    pub fn failed(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The step's verdict on the SLOs that decide the knee: missed when one of them missed
    /// (client-limited when its client lagged past the bound meanwhile), unjudged when one had
    /// too few requests, met when all held.
    pub fn verdict(&self) -> Judgement {
        if self.requests > 0 && self.failed() == self.requests {
            // Nothing was served at this load: a miss whatever the SLOs count.
            return Judgement::Missed;
        }
        match self.slo_verdict() {
            // Lag only makes latencies look worse: a step that met its SLOs met them.
            Judgement::Missed if self.client_behind() => Judgement::ClientLimited,
            verdict => verdict,
        }
    }

    /// The deciding SLOs' verdict, whoever lagged.
    fn slo_verdict(&self) -> Judgement {
        let verdicts: Vec<Judgement> = self
            .attainment
            .iter()
            .filter(|a| a.required)
            .map(|a| a.verdict())
            .collect();
        if verdicts.contains(&Judgement::Missed) {
            Judgement::Missed
        } else if verdicts.contains(&Judgement::Unjudged) {
            Judgement::Unjudged
        } else {
            Judgement::Met
        }
    }

    /// Why the step has nothing to judge by, when it has not: no request in its window, or
    /// every request failed (with one reason per kind of failure).
    pub fn note(&self) -> Option<String> {
        if self.requests == 0 {
            return Some(format!(
                "no request was sent in the {}s window (each takes longer than the window?): lengthen --duration",
                self.window_s
            ));
        }
        if self.failed() < self.requests {
            return None;
        }
        let reasons: Vec<String> = self
            .error_examples
            .iter()
            .map(|(outcome, message)| format!("{outcome}: {message}"))
            .collect();
        Some(format!("every request failed ({})", reasons.join("; ")))
    }

    /// The deciding SLOs too few requests judged, with how many each had and needed.
    pub fn unjudged(&self) -> Vec<&Attainment> {
        self.attainment
            .iter()
            .filter(|a| a.required && a.verdict() == Judgement::Unjudged)
            .collect()
    }

    /// The deciding SLO that missed its objective by the most (relative to its error budget).
    pub fn limited_by(&self) -> Option<&str> {
        self.attainment
            .iter()
            .filter(|a| a.required && a.verdict() == Judgement::Missed)
            .max_by(|a, b| shortfall(a).total_cmp(&shortfall(b)))
            .map(|a| a.slo.as_str())
    }
}

/// Requests completed per second under `load`. Closed loop, by Little's law: C clients that
/// each wait for their answer complete C / mean(e2e) requests per second, whatever the phase
/// of their waves within the window. Open loop: the requests that arrived in the window, per
/// second of it (the arrival rate, which completions match while the engine keeps up).
pub fn throughput(load: Load, requests: usize, busy_s: f64, window_s: f64) -> f64 {
    match load {
        Load::Concurrency(clients) if busy_s > 0.0 => clients as f64 * requests as f64 / busy_s,
        Load::Concurrency(_) => 0.0,
        Load::Rate(_) => requests as f64 / window_s,
    }
}

/// How far below its objective an SLO fell, in error budgets (NaN attainment: the worst).
fn shortfall(a: &Attainment) -> f64 {
    if a.attainment.is_nan() {
        return f64::INFINITY;
    }
    (a.objective - a.attainment) / (1.0 - a.objective)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Operation;
    use crate::record::RequestRecord;
    use crate::slo::spec::{GoodputEntry, SloEntry, SloFile};
    use tokio::time::Instant;

    fn slos(require: &[&str]) -> SloSet {
        let entry = |name: &str, ttft: Option<u64>, tpot: Option<u64>| SloEntry {
            answer_ttft: None,
            name: name.into(),
            objective: 99.0,
            ttft: ttft.map(Duration::from_millis),
            tpot: tpot.map(Duration::from_millis),
            e2e: None,
            availability: false,
            max_prompt_tokens: None,
            per_1k_prompt_tokens: None,
            runbook_url: None,
        };
        let file = SloFile {
            slos: vec![entry("ttft", Some(500), None), entry("tpot", None, Some(30))],
            goodput: Some(GoodputEntry {
                require: require.iter().map(|s| s.to_string()).collect(),
            }),
        };
        SloSet::validate(None, None, None, file).unwrap()
    }

    fn sample(outcome: Outcome, ttft_ms: u64, tpot_ms: u64, tokens: u64) -> Sample {
        Sample {
            sent: Instant::now(),
            record: RequestRecord {
                outcome,
                ttft: Some(Duration::from_millis(ttft_ms)),
                answer_ttft: Some(Duration::from_millis(ttft_ms)),
                tpot_per_choice: vec![Duration::from_millis(tpot_ms)],
                output_tokens: Some(tokens),
                input_tokens: Some(10),
                token_events: tokens,
                ..RequestRecord::new(
                    "m".into(),
                    Operation::Chat,
                    Duration::from_millis(ttft_ms + tpot_ms * (tokens - 1)),
                )
            },
            gaps: vec![Duration::from_millis(tpot_ms); tokens as usize - 1],
            ttfb: Some(Duration::from_millis(ttft_ms)),
            failure: (outcome != Outcome::Success).then(|| "503 Service Unavailable".to_string()),
            asked_output_tokens: tokens as u32,
        }
    }

    #[test]
    fn quantiles_are_observed_values() {
        let q = Quantiles::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((q.p50, q.p90, q.p99, q.mean), (50.0, 90.0, 99.0, 50.5));
        assert!(Quantiles::of(vec![]).p99.is_nan());
        assert_eq!(Quantiles::of(vec![0.25]).p50, 0.25);
    }

    #[tokio::test]
    async fn requests_that_ended_before_the_length_asked_are_counted_by_api() {
        let mut samples = vec![sample(Outcome::Success, 100, 20, 10); 3];
        samples[0].asked_output_tokens = 64;
        samples[1].record.operation = Operation::Messages;
        samples[1].asked_output_tokens = 11;
        samples.push(Sample {
            asked_output_tokens: 64,
            ..sample(Outcome::UpstreamError, 100, 20, 10)
        });
        let step = StepResult::from_samples(Load::Rate(1.0), Duration::from_secs(10), &samples, &slos(&["tpot"]));
        assert_eq!(
            step.ended_early,
            BTreeMap::from([("chat", (1, 2)), ("messages", (1, 1))]),
            "failed requests are not counted"
        );
    }

    #[tokio::test]
    async fn attainment_goodput_and_throughput() {
        let mut samples = vec![sample(Outcome::Success, 100, 20, 10); 91];
        samples.extend(vec![sample(Outcome::Success, 100, 40, 10); 7]); // miss the TPOT SLO
        samples.push(sample(Outcome::Success, 900, 20, 10)); // misses the TTFT SLO
        samples.push(sample(Outcome::UpstreamError, 100, 20, 10));
        let step = StepResult::from_samples(Load::Rate(10.0), Duration::from_secs(10), &samples, &slos(&["tpot"]));
        assert_eq!(step.requests, 100);
        assert_eq!(step.errors.get("upstream_error"), Some(&1));
        assert_eq!(step.error_examples["upstream_error"], "503 Service Unavailable");
        // The TPOT SLO judged the 99 successes: 92 good. Fewer than the 500 a 99 % objective
        // needs, but 7 bad is more than a sample of 500 may hold (5): a miss all the same.
        let tpot = &step.attainment[1];
        assert_eq!((tpot.valid, tpot.good, tpot.required), (99, 92, true));
        assert_eq!(tpot.verdict(), Judgement::Missed);
        assert!(!step.attainment[0].required, "only goodput.require decides");
        assert_eq!(step.verdict(), Judgement::Missed);
        assert_eq!(step.limited_by(), Some("tpot"));
        // Goodput: the 92 that met TPOT (the slow-TTFT one counts: TTFT is not required).
        assert!((step.goodput_requests_per_second - 9.2).abs() < 1e-9);
        assert!((step.goodput_output_tokens_per_second - 92.0).abs() < 1e-9);
        assert_eq!(step.output_tokens_per_second, 99.0);
        assert_eq!(step.ttft.p99, 0.9);
        assert_eq!(step.tpot.p50, 0.02);
        assert_eq!(step.itl.p50, 0.02);
        assert_eq!(step.prompt_tokens_mean, 10.0);
        assert!((step.per_user_tokens_per_second - (92.0 * 50.0 + 7.0 * 25.0) / 99.0).abs() < 1e-9);
    }

    #[test]
    fn an_objective_needs_five_over_its_error_budget_in_events() {
        assert_eq!(events_needed(0.99), 500);
        assert_eq!(events_needed(0.9), 50);
        assert_eq!(events_needed(0.999), 5000);
        let slo = |valid: u64, good: u64| Attainment {
            slo: "tpot".into(),
            objective: 0.99,
            valid,
            good,
            attainment: good as f64 / valid as f64,
            required: true,
        };
        assert_eq!(
            slo(9, 9).verdict(),
            Judgement::Unjudged,
            "a 99 % objective from 9 requests"
        );
        assert_eq!(
            slo(100, 95).verdict(),
            Judgement::Unjudged,
            "5 bad fit in a sample of 500"
        );
        assert_eq!(slo(100, 94).verdict(), Judgement::Missed, "6 bad do not");
        assert_eq!(slo(500, 495).verdict(), Judgement::Met);
        assert_eq!(slo(500, 494).verdict(), Judgement::Missed);
    }

    #[tokio::test]
    async fn closed_loop_throughput_follows_littles_law() {
        // 4 clients, each request 280 ms: 4 / 0.28 s = 14.29 req/s, whatever the window.
        let samples = vec![sample(Outcome::Success, 100, 20, 10); 12];
        for window in [1, 3, 7] {
            let step =
                StepResult::from_samples(Load::Concurrency(4), Duration::from_secs(window), &samples, &slos(&[]));
            assert!((step.requests_per_second - 4.0 / 0.28).abs() < 1e-9);
            assert!((step.output_tokens_per_second - 40.0 / 0.28).abs() < 1e-9);
            assert!((step.goodput_requests_per_second - step.requests_per_second).abs() < 1e-9);
        }
        assert_eq!(throughput(Load::Concurrency(4), 0, 0.0, 1.0), 0.0);
    }

    #[tokio::test]
    async fn without_goodput_require_every_slo_decides() {
        let samples = vec![sample(Outcome::Success, 100, 20, 10); 500];
        let step = StepResult::from_samples(Load::Rate(2.0), Duration::from_secs(5), &samples, &slos(&[]));
        assert!(step
            .attainment
            .iter()
            .all(|a| a.required && a.verdict() == Judgement::Met));
        assert_eq!(step.verdict(), Judgement::Met);
        assert_eq!(step.limited_by(), None);
        let few = StepResult::from_samples(Load::Rate(2.0), Duration::from_secs(5), &samples[..50], &slos(&[]));
        assert_eq!(few.verdict(), Judgement::Unjudged);
        assert_eq!(few.unjudged().len(), 2);
        let none = StepResult::from_samples(Load::Rate(2.0), Duration::from_secs(5), &[], &slos(&[]));
        assert_eq!(
            none.verdict(),
            Judgement::Unjudged,
            "an SLO that judged nothing is not met"
        );
    }
}
