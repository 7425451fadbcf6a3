//! How many words make a prompt of N tokens on this target. A replayed or drawn request must
//! reach the engine with its recorded prompt length, but tokenizers differ: one short word is
//! one token for the BPE tokenizers of the common models, two or three for a small one, and a
//! chat template adds its own. Before the steps, two prompts of known word counts go to each
//! endpoint the workload uses; the engine's usage gives tokens per word (the slope) and each
//! endpoint's overhead (the intercept).

use super::client::{Endpoint, Planned, Requester};
use super::prompts::Prompt;

/// The two calibration prompts' lengths, in words.
const PROBES: [u32; 2] = [32, 256];
/// Tokens per word outside this range are not believed: the words stay one token each.
const PLAUSIBLE: std::ops::RangeInclusive<f64> = 0.2..=20.0;

/// Corrections tried on the synthetic prompt after the scale's first estimate.
const FITS: usize = 4;

/// Words per token on one target, and each endpoint's overhead.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptScale {
    /// Tokens the engine counts per word.
    pub tokens_per_word: f64,
    /// Tokens the engine adds on each endpoint (a chat template), by endpoint.
    pub overhead: Vec<(Endpoint, f64)>,
    /// The synthetic prompt as the engine counted it: its words, and its tokens.
    pub synthetic: Option<(u32, u64)>,
}

impl Default for PromptScale {
    /// One token a word, nothing added: what the synthetic words are on BPE tokenizers.
    fn default() -> Self {
        Self {
            tokens_per_word: 1.0,
            overhead: Vec::new(),
            synthetic: None,
        }
    }
}

impl PromptScale {
    /// The words that make a prompt of `tokens` tokens on `endpoint` (at least one).
    pub fn words(&self, endpoint: Endpoint, tokens: u32) -> u32 {
        let overhead = self
            .overhead
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map_or(0.0, |(_, o)| *o);
        ((f64::from(tokens) - overhead) / self.tokens_per_word).round().max(1.0) as u32
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        let overheads: Vec<String> = self
            .overhead
            .iter()
            .map(|(endpoint, tokens)| format!("{} +{tokens:.0}", endpoint.api()))
            .collect();
        let synthetic = self.synthetic.map_or(String::new(), |(words, tokens)| {
            format!("; the synthetic prompt: {words} words, {tokens} tokens by its count")
        });
        format!(
            "prompts: {:.2} tokens a word on this target ({}){synthetic}\n",
            self.tokens_per_word,
            overheads.join(", ")
        )
    }

    /// The words of the synthetic prompt of `tokens` tokens on `endpoint`: as the engine
    /// counted them where [`fit_synthetic`] measured it, else by the scale.
    pub fn synthetic_words(&self, endpoint: Endpoint, tokens: u32) -> u32 {
        self.synthetic
            .map_or_else(|| self.words(endpoint, tokens), |(words, _)| words)
    }
}

/// Sizes the one synthetic prompt every request sends by the engine's own count of it: the
/// words the scale gives, then corrections by the tokens a word until the count is as near
/// `tokens` as whole words get. A short prompt needs it: its few words are not the probes'
/// mix, and the probes leave a chat template's few tokens in their noise (64 tokens asked of
/// a real vLLM came to 73 without it). The words nearest are kept.
pub async fn fit_synthetic(requester: &Requester, endpoint: Endpoint, tokens: u32, scale: &mut PromptScale) {
    let mut words = scale.words(endpoint, tokens);
    let mut tried: Vec<(u32, u64)> = Vec::new();
    for _ in 0..=FITS {
        let probe = Planned {
            endpoint,
            prompt: super::prompts::synthetic(words),
            output_tokens: 1,
        };
        let Some(counted) = requester.send(&probe).await.record.input_tokens else {
            break;
        };
        tried.push((words, counted));
        let step = ((f64::from(tokens) - counted as f64) / scale.tokens_per_word).round() as i64;
        let next = (i64::from(words) + step).max(1) as u32;
        if tried.iter().any(|&(w, _)| w == next) {
            break;
        }
        words = next;
    }
    scale.synthetic = tried
        .into_iter()
        .min_by_key(|&(w, counted)| (counted.abs_diff(u64::from(tokens)), w));
}

/// Measures the target's scale with two prompts on each of `endpoints`; `None` (a word a
/// token) when the engine reports no prompt tokens or implausible ones.
pub async fn measure(requester: &Requester, endpoints: &[Endpoint]) -> Option<PromptScale> {
    let mut points: Vec<(Endpoint, [f64; 2])> = Vec::new();
    for &endpoint in endpoints {
        let mut tokens = [0.0; 2];
        for (i, words) in PROBES.into_iter().enumerate() {
            let probe = Planned {
                endpoint,
                prompt: Prompt::Sized {
                    words,
                    salt: u64::from(words),
                },
                output_tokens: 1,
            };
            tokens[i] = requester.send(&probe).await.record.input_tokens? as f64;
        }
        points.push((endpoint, tokens));
    }
    fit(&points)
}

/// The slope shared by every endpoint (their mean) and each one's intercept.
fn fit(points: &[(Endpoint, [f64; 2])]) -> Option<PromptScale> {
    if points.is_empty() {
        return None;
    }
    let span = f64::from(PROBES[1] - PROBES[0]);
    let slope = points.iter().map(|(_, t)| (t[1] - t[0]) / span).sum::<f64>() / points.len() as f64;
    if !PLAUSIBLE.contains(&slope) {
        return None;
    }
    Some(PromptScale {
        synthetic: None,
        tokens_per_word: slope,
        overhead: points
            .iter()
            .map(|(endpoint, t)| (*endpoint, (t[0] - slope * f64::from(PROBES[0])).max(0.0)))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_scaled_by_the_slope_less_the_overhead() {
        let scale = fit(&[
            (Endpoint::Chat, [32.0 * 2.5 + 12.0, 256.0 * 2.5 + 12.0]),
            (Endpoint::Completions, [32.0 * 2.5 + 1.0, 256.0 * 2.5 + 1.0]),
        ])
        .unwrap();
        assert_eq!(scale.tokens_per_word, 2.5);
        assert_eq!(scale.words(Endpoint::Chat, 512), 200);
        assert_eq!(scale.words(Endpoint::Completions, 501), 200);
        assert_eq!(scale.words(Endpoint::Chat, 3), 1, "at least a word");
        assert_eq!(
            scale.words(Endpoint::Messages, 250),
            100,
            "no overhead measured: none taken"
        );
        assert_eq!(
            scale.describe(),
            "prompts: 2.50 tokens a word on this target (chat +12, completions +1)\n"
        );
        assert_eq!(PromptScale::default().words(Endpoint::Chat, 77), 77);
    }

    #[test]
    fn implausible_counts_are_not_believed() {
        assert_eq!(fit(&[(Endpoint::Chat, [10.0, 10.0])]), None, "a flat count");
        assert_eq!(fit(&[(Endpoint::Chat, [32.0 * 50.0, 256.0 * 50.0])]), None);
        assert_eq!(fit(&[]), None);
    }
}
