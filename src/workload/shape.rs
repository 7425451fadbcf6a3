//! A workload's shape: its arrival rate and burstiness, its API and model mix, and each mix
//! class's prompt and output length distributions, read off a trace. It is saved and read back
//! as YAML, and draws requests like those it was read from, at any rate.

use super::trace::{Trace, TraceRow};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Points each length distribution keeps: every percentile, from the shortest to the longest.
pub const QUANTILE_POINTS: usize = 101;
/// Burstiness is estimated from at least this many gaps between arrivals; fewer say Poisson.
pub const MIN_GAPS: usize = 20;

/// A mix class's API and model.
type ClassKey = (String, Option<String>);
/// A class's prompt and output lengths.
type Lengths = (Vec<u32>, Vec<u32>);

/// A workload's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// Requests the shape was read from.
    pub requests: usize,
    /// Their mean arrival rate, requests per second.
    pub rate: f64,
    /// The gamma shape of the gaps between arrivals, as vLLM's `--burstiness`: 1 is Poisson,
    /// below 1 burstier, above 1 steadier.
    pub burstiness: f64,
    /// The mix: one class per API and model, most frequent first.
    pub classes: Vec<Class>,
}

/// The requests of one API and model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    /// The API (`chat`, `completions`, `responses`, `messages`).
    pub api: String,
    /// The model, when the trace named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Its share of the requests, 0 to 1.
    pub share: f64,
    /// Prompt tokens: every percentile, p0 to p100.
    pub input_tokens: Vec<u32>,
    /// Output tokens: every percentile, p0 to p100.
    pub output_tokens: Vec<u32>,
}

impl Shape {
    /// The shape of `trace`; a class is an API and model (`unnamed_api` where the trace names
    /// none: the endpoint its requests are sent to).
    pub fn of(trace: &Trace, unnamed_api: &str) -> Result<Self, String> {
        if trace.rows.is_empty() {
            return Err("the trace holds no request".into());
        }
        let mut groups: BTreeMap<ClassKey, Lengths> = BTreeMap::new();
        for row in &trace.rows {
            let api = row.api.clone().unwrap_or_else(|| unnamed_api.into());
            let (input, output) = groups.entry((api, row.model.clone())).or_default();
            input.push(row.input_length);
            output.push(row.output_length);
        }
        let total = trace.rows.len() as f64;
        let mut classes: Vec<Class> = groups
            .into_iter()
            .map(|((api, model), (input, output))| Class {
                api,
                model,
                share: input.len() as f64 / total,
                input_tokens: percentiles(input),
                output_tokens: percentiles(output),
            })
            .collect();
        classes.sort_by(|a, b| b.share.total_cmp(&a.share));
        Ok(Self {
            requests: trace.rows.len(),
            rate: trace.rate(),
            burstiness: burstiness(trace),
            classes,
        })
    }

    /// Reads a shape file.
    pub fn from_yaml(name: &str, text: &str) -> Result<Self, String> {
        let shape: Shape = serde_yaml::from_str(text).map_err(|e| format!("{name}: not a workload shape ({e})"))?;
        shape.check().map_err(|e| format!("{name}: {e}"))?;
        Ok(shape)
    }

    /// The shape as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("a shape serializes")
    }

    fn check(&self) -> Result<(), String> {
        if !(self.burstiness.is_finite() && self.burstiness > 0.0) {
            return Err(format!("burstiness {}: a number above zero", self.burstiness));
        }
        if self.classes.is_empty() {
            return Err("no classes".into());
        }
        for class in &self.classes {
            if !(class.share.is_finite() && class.share >= 0.0) {
                return Err(format!("class {}: share {} is not a fraction", class.api, class.share));
            }
            for (what, points) in [
                ("input_tokens", &class.input_tokens),
                ("output_tokens", &class.output_tokens),
            ] {
                if points.len() != QUANTILE_POINTS || points.windows(2).any(|w| w[0] > w[1]) {
                    return Err(format!(
                        "class {}: {what} must be {QUANTILE_POINTS} rising percentiles (p0 to p100)",
                        class.api
                    ));
                }
                if points.iter().any(|&n| n > super::trace::MAX_LENGTH) {
                    return Err(format!(
                        "class {}: {what} above {} tokens",
                        class.api,
                        super::trace::MAX_LENGTH
                    ));
                }
            }
            if class.output_tokens[0] == 0 {
                return Err(format!(
                    "class {}: output_tokens start at 0; requests ask for at least one",
                    class.api
                ));
            }
        }
        if self.classes.iter().map(|c| c.share).sum::<f64>() <= 0.0 {
            return Err("the classes' shares add up to zero".into());
        }
        Ok(())
    }

    /// `count` requests drawn from the shape, seeded: each class by its share, each length
    /// from its distribution (arrival times are the load's, not the shape's: all at 0).
    pub fn draw(&self, count: usize, seed: u64) -> Vec<TraceRow> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let total: f64 = self.classes.iter().map(|c| c.share).sum();
        (0..count)
            .map(|_| {
                let mut pick = rng.random::<f64>() * total;
                let class = self
                    .classes
                    .iter()
                    .find(|c| {
                        pick -= c.share;
                        pick < 0.0
                    })
                    .unwrap_or(&self.classes[self.classes.len() - 1]);
                let input = sample(&class.input_tokens, rng.random());
                let output = sample(&class.output_tokens, rng.random()).max(1);
                TraceRow {
                    api: Some(class.api.clone()),
                    model: class.model.clone(),
                    ..TraceRow::lengths(input, output)
                }
            })
            .collect()
    }

    /// A few lines for the report: the rate, burstiness and each class's lengths.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "workload: {} requests at {:.2} req/s, burstiness {:.2} ({})\n",
            self.requests,
            self.rate,
            self.burstiness,
            if self.burstiness < 0.8 {
                "bursty"
            } else if self.burstiness > 1.25 {
                "steadier than Poisson"
            } else {
                "about Poisson"
            }
        );
        for class in &self.classes {
            let p = |points: &[u32]| format!("p50 {} p90 {} p99 {}", points[50], points[90], points[99]);
            out.push_str(&format!(
                "  {:>5.1} % {}{}: prompt {}; output {}\n",
                class.share * 100.0,
                class.api,
                class.model.as_ref().map(|m| format!(" {m}")).unwrap_or_default(),
                p(&class.input_tokens),
                p(&class.output_tokens)
            ));
        }
        out
    }
}

/// Every percentile of `values` (nearest rank), p0 to p100.
fn percentiles(mut values: Vec<u32>) -> Vec<u32> {
    values.sort_unstable();
    (0..QUANTILE_POINTS)
        .map(|p| {
            let rank = (p as f64 / 100.0 * values.len() as f64).ceil() as usize;
            values[rank.clamp(1, values.len()) - 1]
        })
        .collect()
}

/// A length drawn from percentiles by inverse transform, `u` uniform in [0, 1).
fn sample(points: &[u32], u: f64) -> u32 {
    let at = u * (points.len() - 1) as f64;
    let i = (at.floor() as usize).min(points.len() - 2);
    let (low, high) = (points[i] as f64, points[i + 1] as f64);
    (low + (at - i as f64) * (high - low)).round() as u32
}

/// The gamma shape of the gaps between arrivals, by moments (mean² / variance), as vLLM's
/// burstiness; 1 (Poisson) with too few gaps to tell.
fn burstiness(trace: &Trace) -> f64 {
    let gaps: Vec<f64> = trace
        .rows
        .windows(2)
        .map(|w| (w[1].timestamp - w[0].timestamp) as f64)
        .collect();
    if gaps.len() < MIN_GAPS {
        return 1.0;
    }
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let variance = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (gaps.len() - 1) as f64;
    if variance <= 0.0 || mean <= 0.0 {
        return 100.0;
    }
    (mean * mean / variance).clamp(0.01, 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_distr::{Distribution, Gamma};

    fn trace_of(rows: Vec<TraceRow>) -> Trace {
        Trace::new(rows)
    }

    #[test]
    fn the_mix_and_lengths_are_read_and_drawn_back() {
        let mut rows = Vec::new();
        for i in 0..1000u32 {
            let (api, input, output) = if i % 4 == 0 {
                ("completions", 2000 + i, 20)
            } else {
                ("chat", 100 + i % 50, 200 + i % 100)
            };
            rows.push(TraceRow {
                timestamp: u64::from(i) * 100,
                api: Some(api.into()),
                model: Some("m".into()),
                ..TraceRow::lengths(input, output)
            });
        }
        let shape = Shape::of(&trace_of(rows), "chat").unwrap();
        assert_eq!(shape.requests, 1000);
        assert!((shape.rate - 10.0).abs() < 1e-9);
        assert_eq!(shape.burstiness, 100.0, "evenly spaced: as steady as it gets");
        assert_eq!(shape.classes[0].api, "chat");
        assert_eq!(shape.classes[0].share, 0.75);
        assert_eq!(shape.classes[1].input_tokens[0], 2000);
        assert_eq!(shape.classes[1].output_tokens[100], 20);
        let drawn = shape.draw(20_000, 7);
        let chat: Vec<&TraceRow> = drawn.iter().filter(|r| r.api.as_deref() == Some("chat")).collect();
        assert!((chat.len() as f64 / 20_000.0 - 0.75).abs() < 0.02, "{}", chat.len());
        let mut outputs: Vec<u32> = chat.iter().map(|r| r.output_length).collect();
        outputs.sort_unstable();
        let median = outputs[outputs.len() / 2];
        assert!((245..=255).contains(&median), "{median}");
        assert!(drawn.iter().all(|r| r.model.as_deref() == Some("m")));
        let again = Shape::from_yaml("s.yaml", &shape.to_yaml()).unwrap();
        assert_eq!(again, shape, "saved and read back the same");
    }

    #[test]
    fn burstiness_matches_the_gamma_shape_that_drew_the_arrivals() {
        for (k, tolerance) in [(0.25, 0.05), (1.0, 0.15), (4.0, 0.6)] {
            let gamma = Gamma::new(k, 1000.0 / (5.0 * k)).unwrap();
            let mut rng = SmallRng::seed_from_u64(3);
            let mut at = 0.0;
            let rows: Vec<TraceRow> = (0..20_000)
                .map(|_| {
                    at += gamma.sample(&mut rng);
                    TraceRow {
                        timestamp: at as u64,
                        ..TraceRow::lengths(1, 1)
                    }
                })
                .collect();
            let shape = Shape::of(&trace_of(rows), "chat").unwrap();
            assert!((shape.burstiness - k).abs() < tolerance, "k={k}: {}", shape.burstiness);
            assert!((shape.rate - 5.0).abs() < 0.2, "{}", shape.rate);
        }
    }

    #[test]
    fn requests_that_name_no_api_are_the_endpoints_they_are_sent_to() {
        let named = TraceRow {
            api: Some("chat".into()),
            ..TraceRow::lengths(3, 4)
        };
        let rows = vec![TraceRow::lengths(3, 4), TraceRow::lengths(5, 6), named];
        let shape = Shape::of(&trace_of(rows), "messages").unwrap();
        let apis: Vec<(&str, f64)> = shape.classes.iter().map(|c| (c.api.as_str(), c.share)).collect();
        assert_eq!(apis, [("messages", 2.0 / 3.0), ("chat", 1.0 / 3.0)]);
        assert!(shape.describe().contains("% messages: prompt"), "{}", shape.describe());
    }

    #[test]
    fn a_bad_shape_file_says_what_is_wrong() {
        let shape = Shape::of(&trace_of(vec![TraceRow::lengths(3, 4)]), "chat").unwrap();
        assert_eq!(shape.burstiness, 1.0, "one request: Poisson");
        let error = |yaml: String| Shape::from_yaml("s", &yaml).unwrap_err();
        assert!(error(shape.to_yaml().replace("burstiness: 1.0", "burstiness: 0.0"))
            .contains("burstiness 0: a number above zero"));
        assert!(error("rate: 1\n".into()).starts_with("s: not a workload shape"));
        let mut short = shape.clone();
        short.classes[0].input_tokens.pop();
        assert!(error(short.to_yaml()).contains("input_tokens must be 101 rising percentiles"));
        let mut zero = shape.clone();
        zero.classes[0].output_tokens[0] = 0;
        assert!(error(zero.to_yaml()).contains("output_tokens start at 0"));
    }
}
