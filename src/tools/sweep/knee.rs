//! The search for the knee: double the concurrency from 1 until the SLOs fail, then bisect
//! between the last passing and the first failing concurrency until they are within 10 %. A
//! rate search does the same from a starting rate, halving first when that one fails.

/// How close the last passing and first failing concurrency must come.
pub const TOLERANCE: f64 = 0.10;
/// Bisection steps after the doubling, at most.
pub const MAX_BISECTIONS: u32 = 8;

/// The knee's bracket: the highest load that met the SLOs, the lowest that missed, and how
/// many bisections between them were measured. Both searches narrow one.
#[derive(Debug, Clone, PartialEq)]
struct Bracket<T> {
    passing: Option<T>,
    failing: Option<T>,
    bisections: u32,
}

impl<T: Copy + PartialOrd> Bracket<T> {
    fn new() -> Self {
        Self {
            passing: None,
            failing: None,
            bisections: 0,
        }
    }

    /// Takes the verdict of a measured load.
    fn observe(&mut self, load: T, met_slos: bool) {
        if self.passing.is_some() && self.failing.is_some() {
            self.bisections += 1;
        }
        let (side, keep_higher) = if met_slos {
            (&mut self.passing, true)
        } else {
            (&mut self.failing, false)
        };
        *side = Some(match *side {
            Some(old) if (old > load) == keep_higher => old,
            _ => load,
        });
    }

    /// The midpoint, while the two ends are not yet `close` and bisections remain.
    fn bisect(&self, close: bool, midpoint: T) -> Option<T> {
        (!close && self.bisections < MAX_BISECTIONS).then_some(midpoint)
    }

    /// Every load up to `max` met the SLOs.
    fn reached(&self, max: T) -> bool {
        self.failing.is_none() && self.passing.is_some_and(|p| p >= max)
    }
}

/// Where the search stands.
#[derive(Debug, Clone, PartialEq)]
pub struct KneeSearch {
    max: usize,
    bracket: Bracket<usize>,
}

impl KneeSearch {
    /// A search that goes no higher than `max` clients.
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            bracket: Bracket::new(),
        }
    }

    /// The next concurrency to measure, or `None` when the search is over.
    pub fn next(&self) -> Option<usize> {
        match (self.bracket.passing, self.bracket.failing) {
            (None, None) => Some(1),
            (None, Some(_)) => None,
            (Some(pass), None) if pass >= self.max => None,
            (Some(pass), None) => Some((pass * 2).min(self.max)),
            (Some(pass), Some(fail)) => {
                let close = (fail - pass) as f64 <= (TOLERANCE * pass as f64).max(1.0);
                self.bracket.bisect(close, pass + (fail - pass) / 2)
            }
        }
    }

    /// Takes the verdict of a measured concurrency.
    pub fn observe(&mut self, concurrency: usize, met_slos: bool) {
        self.bracket.observe(concurrency, met_slos);
    }

    /// The highest concurrency that met the SLOs, once the search is over.
    pub fn knee(&self) -> Option<usize> {
        self.bracket.passing
    }

    /// The search stopped at `max` without the SLOs failing: the knee is at least that.
    pub fn reached_max(&self) -> bool {
        self.bracket.reached(self.max)
    }
}

/// Lowest rate a rate search tries, as a fraction of its start.
pub const RATE_FLOOR: f64 = 1.0 / 64.0;

/// Where a search over arrival rates stands.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSearch {
    start: f64,
    max: f64,
    bracket: Bracket<f64>,
}

impl RateSearch {
    /// A search from `start` requests per second that goes no higher than `max`.
    pub fn new(start: f64, max: f64) -> Self {
        Self {
            start: start.min(max),
            max,
            bracket: Bracket::new(),
        }
    }

    /// The next rate to measure, or `None` when the search is over.
    pub fn next(&self) -> Option<f64> {
        match (self.bracket.passing, self.bracket.failing) {
            (None, None) => Some(self.start),
            (None, Some(fail)) => (fail / 2.0 >= self.start * RATE_FLOOR).then_some(fail / 2.0),
            (Some(pass), None) if pass >= self.max => None,
            (Some(pass), None) => Some((pass * 2.0).min(self.max)),
            (Some(pass), Some(fail)) => {
                let close = fail - pass <= TOLERANCE * pass;
                self.bracket.bisect(close, (pass + fail) / 2.0)
            }
        }
    }

    /// Takes the verdict of a measured rate.
    pub fn observe(&mut self, rate: f64, met_slos: bool) {
        self.bracket.observe(rate, met_slos);
    }

    /// The search stopped at `max` without the SLOs failing.
    pub fn reached_max(&self) -> bool {
        self.bracket.reached(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a knee at `true_knee` and returns the concurrencies measured.
    fn search(true_knee: usize, max: usize) -> (Vec<usize>, KneeSearch) {
        let mut s = KneeSearch::new(max);
        let mut measured = Vec::new();
        while let Some(c) = s.next() {
            measured.push(c);
            s.observe(c, c <= true_knee);
            assert!(measured.len() < 40, "the search must end");
        }
        (measured, s)
    }

    #[test]
    fn doubles_then_bisects_to_within_ten_percent() {
        let (measured, s) = search(40, 1024);
        assert_eq!(measured, [1, 2, 4, 8, 16, 32, 64, 48, 40, 44]);
        assert_eq!(s.knee(), Some(40));
        let (measured, s) = search(200, 1024);
        assert_eq!(s.knee(), Some(192), "within 10 % of 200");
        assert!(measured.len() <= 9 + MAX_BISECTIONS as usize, "{measured:?}");
    }

    #[test]
    fn every_knee_is_found_within_the_tolerance() {
        for knee in 1..=300 {
            let (_, s) = search(knee, 1024);
            let found = s.knee().unwrap();
            assert!(
                found <= knee && (knee - found) as f64 <= TOLERANCE * knee as f64 + 1.0,
                "{knee}: {found}"
            );
        }
    }

    #[test]
    fn a_rate_search_halves_or_doubles_then_bisects_to_within_ten_percent() {
        for (knee, start) in [(7.3, 1.0), (7.3, 50.0), (0.2, 4.0), (1000.0, 3.0)] {
            let mut s = RateSearch::new(start, 500.0);
            let mut measured = Vec::new();
            while let Some(rate) = s.next() {
                measured.push(rate);
                s.observe(rate, rate <= knee);
                assert!(measured.len() < 40);
            }
            let best = measured.iter().copied().filter(|r| *r <= knee).fold(f64::NAN, f64::max);
            if knee >= 500.0 {
                assert!(s.reached_max() && best == 500.0, "{measured:?}");
            } else {
                assert!(
                    best <= knee && knee - best <= 0.1 * best + 1e-9,
                    "{knee} from {start}: {measured:?}"
                );
            }
        }
        let mut never = RateSearch::new(1.0, 10.0);
        let mut tried = 0;
        while let Some(rate) = never.next() {
            never.observe(rate, false);
            tried += 1;
        }
        assert_eq!(tried, 7, "1 down to 1/64, then it stops");
    }

    #[test]
    fn failing_at_one_or_passing_at_max_end_the_search() {
        let (measured, s) = search(0, 1024);
        assert_eq!((measured, s.knee()), (vec![1], None));
        let (measured, s) = search(5000, 100);
        assert_eq!(measured, [1, 2, 4, 8, 16, 32, 64, 100]);
        assert!(s.reached_max() && s.knee() == Some(100));
    }
}
