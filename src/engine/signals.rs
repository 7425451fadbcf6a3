//! The few engine signals that explain an SLO, under one name whatever the engine: each is
//! read from the first series the page has of those listed for it (vLLM, SGLang, TGI), and
//! only where every value is possible for it (a count never negative, a ratio within 0 and 1,
//! a sum that stays finite): an engine's page cannot write an impossible figure into llmslo's.

use super::exposition::Page;

/// Where one engine-neutral signal comes from, and how its series combine.
struct Source {
    /// Series names, in the order they are tried (vLLM's, SGLang's, TGI's).
    names: &'static [&'static str],
    /// Several series (data-parallel ranks, models) add up, or are averaged.
    combine: Combine,
}

/// How several series of one signal make one figure, and what each may be.
#[derive(Clone, Copy)]
enum Combine {
    /// Counts: each finite and not negative, their sum finite.
    Sum,
    /// Ratios: each within 0 and 1.
    Mean,
}

const WAITING: Source = Source {
    names: &[
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "tgi_queue_size",
        "llamacpp:requests_deferred",
    ],
    combine: Combine::Sum,
};
const RUNNING: Source = Source {
    names: &[
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "tgi_batch_current_size",
        "llamacpp:requests_processing",
    ],
    combine: Combine::Sum,
};
const KV_CACHE_USAGE: Source = Source {
    names: &[
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ],
    combine: Combine::Mean,
};
const PREEMPTIONS: Source = Source {
    names: &["vllm:num_preemptions_total", "vllm:num_preemptions"],
    combine: Combine::Sum,
};
const PREFIX_HITS: Source = Source {
    names: &["vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"],
    combine: Combine::Sum,
};
const PREFIX_QUERIES: Source = Source {
    names: &["vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"],
    combine: Combine::Sum,
};
const PREFIX_HIT_RATIO: Source = Source {
    names: &["sglang:cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate"],
    combine: Combine::Mean,
};

/// The engine-neutral signals one page states (each `None` where the engine has no series).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Signals {
    /// Requests waiting in the engine's queue.
    pub waiting: Option<f64>,
    /// Requests the engine is running (in its batch).
    pub running: Option<f64>,
    /// Share of the KV cache in use, 0 to 1.
    pub kv_cache_usage: Option<f64>,
    /// Preemptions since the engine started (a counter).
    pub preemptions: Option<f64>,
    /// Prefix-cache hits and queries since the engine started (counters, vLLM).
    pub prefix_cache: Option<(f64, f64)>,
    /// A hit ratio the engine states itself (SGLang, older vLLM).
    pub prefix_cache_hit_ratio: Option<f64>,
}

impl Signals {
    /// The signals of a parsed page.
    pub fn read(page: &Page) -> Self {
        let hits = value(page, &PREFIX_HITS);
        let queries = value(page, &PREFIX_QUERIES);
        Self {
            waiting: value(page, &WAITING),
            running: value(page, &RUNNING),
            kv_cache_usage: value(page, &KV_CACHE_USAGE),
            preemptions: value(page, &PREEMPTIONS),
            prefix_cache: hits.zip(queries).filter(|(hits, queries)| hits <= queries),
            prefix_cache_hit_ratio: value(page, &PREFIX_HIT_RATIO),
        }
    }

    /// The prefix-cache hit ratio since `earlier`: hits over queries between the two pages
    /// (NaN when nothing was looked up), or the ratio the engine states.
    pub fn prefix_cache_hit_ratio_since(&self, earlier: Option<&Signals>) -> Option<f64> {
        match (self.prefix_cache, earlier.and_then(|e| e.prefix_cache)) {
            (Some((hits, queries)), Some((hits0, queries0))) if queries >= queries0 && hits >= hits0 => {
                let asked = queries - queries0;
                Some(if asked > 0.0 { (hits - hits0) / asked } else { f64::NAN })
            }
            // The first page, or the engine restarted: its whole life so far.
            (Some((hits, queries)), _) => Some(if queries > 0.0 { hits / queries } else { f64::NAN }),
            (None, _) => self.prefix_cache_hit_ratio,
        }
    }
}

/// The first of `source`'s series the page has, its samples combined; `None` when it has none,
/// or one is impossible for the signal.
fn value(page: &Page, source: &Source) -> Option<f64> {
    source.names.iter().find_map(|name| {
        let values: Vec<f64> = page.values(name).collect();
        if values.is_empty() {
            return None;
        }
        let possible = |v: &f64| match source.combine {
            Combine::Sum => v.is_finite() && *v >= 0.0,
            Combine::Mean => (0.0..=1.0).contains(v),
        };
        let sum: f64 = values.iter().sum();
        let combined = match source.combine {
            Combine::Sum => sum,
            Combine::Mean => sum / values.len() as f64,
        };
        // The first series found decides, possible or not: a later name is no fallback.
        Some((values.iter().all(possible) && combined.is_finite()).then_some(combined))
    })?
}

/// Every series a signal may come from, by signal (for the docs' table and its test).
pub fn sources() -> [(&'static str, &'static [&'static str]); 7] {
    [
        ("requests_waiting", WAITING.names),
        ("requests_running", RUNNING.names),
        ("kv_cache_usage_ratio", KV_CACHE_USAGE.names),
        ("preemptions", PREEMPTIONS.names),
        ("prefix_cache_hits", PREFIX_HITS.names),
        ("prefix_cache_queries", PREFIX_QUERIES.names),
        ("prefix_cache_hit_ratio", PREFIX_HIT_RATIO.names),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::exposition;

    fn parse(text: &str) -> Result<Page, exposition::PageError> {
        exposition::parse(text, 20_000)
    }

    #[test]
    fn a_real_vllm_page_states_every_signal() {
        let page = parse(include_str!("../../tests/fixtures/vllm-0.32-metrics.txt")).unwrap();
        let signals = Signals::read(&page);
        assert_eq!(signals.waiting, Some(0.0));
        assert_eq!(signals.running, Some(0.0));
        assert_eq!(signals.kv_cache_usage, Some(0.0));
        assert_eq!(signals.preemptions, Some(0.0));
        assert_eq!(signals.prefix_cache, Some((0.0, 17.0)));
        assert_eq!(signals.prefix_cache_hit_ratio_since(None), Some(0.0));
    }

    #[test]
    fn sglang_and_tgi_pages_map_to_the_same_signals() {
        let sglang = parse(
            "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"m\"} 7\n\
             # TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 12\n\
             # TYPE sglang:token_usage gauge\nsglang:token_usage{model_name=\"m\"} 0.5\n\
             # TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate{model_name=\"m\"} 0.25\n",
        )
        .unwrap();
        let s = Signals::read(&sglang);
        assert_eq!(
            (s.waiting, s.running, s.kv_cache_usage),
            (Some(7.0), Some(12.0), Some(0.5))
        );
        assert_eq!(s.prefix_cache_hit_ratio_since(None), Some(0.25));
        assert_eq!(s.preemptions, None);
        let tgi = parse("# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 8\n").unwrap();
        let t = Signals::read(&tgi);
        assert_eq!((t.waiting, t.running, t.kv_cache_usage), (Some(3.0), Some(8.0), None));
    }

    #[test]
    fn ranks_add_up_usage_averages_and_the_hit_ratio_is_since_the_last_page() {
        let page = |hits: u32, queries: u32| {
            parse(&format!(
                "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\"}} 2\nvllm:num_requests_waiting{{engine=\"1\"}} 3\n\
                 # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{engine=\"0\"}} 0.2\nvllm:kv_cache_usage_perc{{engine=\"1\"}} 0.6\n\
                 # TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total {hits}\n\
                 # TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total {queries}\n"
            ))
            .unwrap()
        };
        let first = Signals::read(&page(10, 100));
        let second = Signals::read(&page(40, 150));
        assert_eq!(first.waiting, Some(5.0));
        assert!((first.kv_cache_usage.unwrap() - 0.4).abs() < 1e-12);
        assert_eq!(second.prefix_cache_hit_ratio_since(Some(&first)), Some(0.6));
        assert!(second.prefix_cache_hit_ratio_since(Some(&second)).unwrap().is_nan());
        assert_eq!(
            first.prefix_cache_hit_ratio_since(Some(&second)),
            Some(0.1),
            "a restart"
        );
    }

    #[test]
    fn impossible_figures_are_no_signal() {
        let s = Signals::read(
            &parse(
                "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{e=\"0\"} 1e308\n\
                 vllm:num_requests_waiting{e=\"1\"} 1e308\n# TYPE vllm:num_requests_running gauge\n\
                 vllm:num_requests_running -3\n# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 7\n\
                 # TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate NaN\n\
                 # TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total 9\n\
                 # TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 3\n",
            )
            .unwrap(),
        );
        assert_eq!(s.waiting, None, "two finite depths whose sum is not");
        assert_eq!(s.running, None, "a negative count");
        assert_eq!(s.kv_cache_usage, None, "a ratio above 1");
        assert_eq!(s.prefix_cache_hit_ratio, None, "NaN");
        assert_eq!(s.prefix_cache, None, "more hits than lookups");
    }
}
