//! The simulated engine's `/metrics` page, in the format and under the names of the engine it
//! plays: queue depth, batch, KV-cache usage, preemptions (the simulator never preempts).

use super::batching::Occupancy;
use super::shape::Flavor;
use std::fmt::Write;

/// The page of an engine of `flavor` serving `model` that holds `occupancy` and has been
/// sent `prompt_tokens` (looked up in its prefix cache, never found: the prompts are random).
pub fn page(flavor: Flavor, model: &str, occupancy: Occupancy, prompt_tokens: u64) -> String {
    let labels = format!(
        "{{model_name=\"{}\"}}",
        model.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let (waiting, running) = (occupancy.waiting as f64, occupancy.running as f64);
    let series: Vec<(&str, &str, &str, f64)> = match flavor {
        Flavor::Vllm => vec![
            ("vllm:num_requests_waiting", "gauge", &labels, waiting),
            ("vllm:num_requests_running", "gauge", &labels, running),
            ("vllm:kv_cache_usage_perc", "gauge", &labels, occupancy.kv_usage),
            ("vllm:num_preemptions_total", "counter", &labels, 0.0),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                &labels,
                prompt_tokens as f64,
            ),
            ("vllm:prefix_cache_hits_total", "counter", &labels, 0.0),
        ],
        Flavor::Tgi => vec![
            ("tgi_queue_size", "gauge", "", waiting),
            ("tgi_batch_current_size", "gauge", "", running),
        ],
        Flavor::Llamacpp => vec![
            ("llamacpp:requests_deferred", "gauge", "", waiting),
            ("llamacpp:requests_processing", "gauge", "", running),
            ("llamacpp:kv_cache_usage_ratio", "gauge", "", occupancy.kv_usage),
        ],
    };
    let mut out = String::new();
    for (name, kind, labels, value) in series {
        let _ = write!(
            out,
            "# HELP {name} Simulated.\n# TYPE {name} {kind}\n{name}{labels} {value:?}\n"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::exposition::parse;
    use crate::engine::signals::Signals;

    #[test]
    fn every_flavor_maps_to_the_same_signals() {
        let occupancy = Occupancy {
            waiting: 3,
            running: 8,
            kv_usage: 0.5,
        };
        for flavor in [Flavor::Vllm, Flavor::Tgi, Flavor::Llamacpp] {
            let signals = Signals::read(&parse(&page(flavor, "m\"x", occupancy, 100), 1000).unwrap());
            assert_eq!((signals.waiting, signals.running), (Some(3.0), Some(8.0)), "{flavor:?}");
        }
    }
}
