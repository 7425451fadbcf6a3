//! Decode steps read from the gaps between a choice's deltas, for the APIs that send no
//! delta for a held-back token (Responses, Messages): a token whose text is not yet whole
//! (part of a UTF-8 character, as CJK and emoji give) waits for the next, so one delta then
//! carries several tokens and the gap before it spans as many decode steps. The gaps are
//! multiples of one step (26, 52, 78 ms…), so their pattern says how many tokens each gap
//! held, and so how many of the held-back tokens the first delta carried.

use std::time::Duration;

/// Gaps kept before the step is estimated; later gaps are counted as they come.
const KEPT_GAPS: usize = 256;
/// The unit gaps are kept in: 50 µs, so that a `u16` holds up to 3.3 s.
const UNIT_NANOS: u64 = 50_000;
/// Fewest gaps that show a pattern.
const MIN_GAPS: u64 = 3;

/// What the gaps of one choice say, in decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    /// Steps between the first delta and the last, each gap at least one (a delta carries a
    /// token).
    pub between: u64,
    /// Steps from the last delta to the event that closed the output (zero when no token was
    /// held back to the end).
    pub tail: u64,
}

/// The gaps between one choice's deltas, as decode steps.
#[derive(Debug, Clone, Default)]
pub struct DecodeSteps {
    /// The first gaps, in [`UNIT_NANOS`], while the step is not yet estimated.
    kept: Vec<u16>,
    /// The step, once [`KEPT_GAPS`] gaps estimated it, and the steps counted since.
    step: Option<u64>,
    counted: u64,
    gaps: u64,
}

impl DecodeSteps {
    /// Adds the gap before a delta.
    pub fn push(&mut self, gap: Duration) {
        self.gaps += 1;
        let units = units(gap);
        match self.step {
            Some(step) => self.counted += gap_steps(units, step),
            None => {
                self.kept.push(units);
                if self.kept.len() == KEPT_GAPS {
                    let step = step_of(&self.kept);
                    self.counted = self.kept.iter().map(|&g| gap_steps(g, step)).sum();
                    self.step = Some(step);
                    self.kept = Vec::new();
                }
            }
        }
    }

    /// The decode steps the gaps span, and those in `tail`, the time from the last delta to
    /// the event that closed the output; `None` with fewer than [`MIN_GAPS`] gaps.
    pub fn count(&self, tail: Duration) -> Option<Steps> {
        if self.gaps < MIN_GAPS {
            return None;
        }
        let (step, between) = match self.step {
            Some(step) => (step, self.counted),
            None => {
                let step = step_of(&self.kept);
                (step, self.kept.iter().map(|&g| gap_steps(g, step)).sum())
            }
        };
        Some(Steps {
            between,
            tail: steps_in(units(tail), step),
        })
    }
}

fn units(gap: Duration) -> u16 {
    u16::try_from(gap.as_nanos() / u128::from(UNIT_NANOS)).unwrap_or(u16::MAX)
}

/// The steps a gap before a delta spans: the nearest multiple of the step, at least one (the
/// delta carries a token).
fn gap_steps(gap: u16, step: u64) -> u64 {
    steps_in(gap, step).max(1)
}

/// Whole steps in a gap: the nearest multiple.
fn steps_in(gap: u16, step: u64) -> u64 {
    if step == 0 {
        return 1;
    }
    (u64::from(gap) + step / 2) / step
}

/// The decode step: the mean of the gaps that are single steps (under one and a half times
/// the median gap, most gaps being single steps). The mean, not the median, because the
/// engine's own TPOT is a mean: steps it stretched (another request's prefill) count in it.
fn step_of(gaps: &[u16]) -> u64 {
    let mut sorted = gaps.to_vec();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).map_or(0, |&g| u64::from(g));
    let (sum, count) = sorted
        .iter()
        .map(|&g| u64::from(g))
        .filter(|&g| 2 * g < 3 * median)
        .fold((0, 0), |(sum, count), g| (sum + g, count + 1));
    sum.checked_div(count).unwrap_or(median)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1e3)
    }

    #[test]
    fn gaps_that_span_several_steps_count_as_many() {
        let mut steps = DecodeSteps::default();
        // The real Responses capture with sampling: 18 gaps over 32 tokens.
        for gap in [
            25.0, 25.2, 25.4, 52.8, 75.1, 26.1, 74.7, 24.9, 25.3, 77.7, 25.2, 105.8, 24.9, 25.3, 26.1, 25.3, 76.9, 25.7,
        ] {
            steps.push(ms(gap));
        }
        let counted = steps.count(ms(0.3)).unwrap();
        assert_eq!(
            (counted.between, counted.tail),
            (30, 0),
            "12 single steps, a double, 4 triples, a quadruple"
        );
        assert_eq!(steps.count(ms(80.0)).unwrap().tail, 3, "three more held to the end");
    }

    #[test]
    fn a_short_gap_is_still_one_token_and_too_few_gaps_show_nothing() {
        let mut steps = DecodeSteps::default();
        steps.push(ms(25.0));
        steps.push(ms(3.0));
        assert_eq!(steps.count(Duration::ZERO), None);
        steps.push(ms(26.0));
        assert_eq!(steps.count(Duration::ZERO).unwrap().between, 3);
    }

    #[test]
    fn past_the_kept_gaps_each_is_counted_as_it_comes() {
        let mut steps = DecodeSteps::default();
        for i in 0..1000 {
            steps.push(ms(if i % 10 == 0 { 40.0 } else { 20.0 }));
        }
        assert_eq!(steps.count(Duration::ZERO).unwrap().between, 1100);
        assert!(steps.kept.capacity() == 0, "the kept gaps are let go");
        // Gaps longer than a u16 of units saturate instead of wrapping.
        steps.push(Duration::from_secs(10));
        assert_eq!(steps.count(Duration::ZERO).unwrap().between, 1100 + 164);
    }
}
