//! The engine's own view: its `/metrics` read in the background and mapped to engine-neutral
//! gauges (and, when asked, re-exported whole on llmslo's `/metrics`), and the engine's
//! per-request phases where its answers state them.

pub mod exposition;
pub mod protobuf;
pub mod scrape;
pub mod signals;

use crate::record::EngineMoment;
use exposition::{OwnNames, Page};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use serde::Deserialize;
use signals::Signals;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// `engine_metrics`: what llmslo does with the engine's `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineMetricsMode {
    /// Not read at all.
    Off,
    /// Read, and its few signals exported as `llmslo_engine_*` gauges (the default).
    #[default]
    Map,
    /// As `map`, and the whole page re-exported on llmslo's `/metrics`: one scrape target.
    Merge,
}

impl EngineMetricsMode {
    /// The value as written in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineMetricsMode::Off => "off",
            EngineMetricsMode::Map => "map",
            EngineMetricsMode::Merge => "merge",
        }
    }
}

#[derive(Debug, Default)]
struct ViewState {
    /// Whether the last scrape succeeded; `None` before the first.
    up: Option<bool>,
    /// How long the last scrape took, in seconds.
    duration: f64,
    /// The last good page's signals, and the prefix-cache hit ratio since the one before.
    signals: Option<Signals>,
    prefix_cache_hit_ratio: Option<f64>,
    /// The last good page, kept for `merge`.
    page: Option<Arc<Page>>,
    /// What the last good page's read left out, and the samples it kept.
    dropped: exposition::Dropped,
    samples: usize,
    /// llmslo's preemption counter: the engine's, carried on across the engine's restarts so
    /// that it never goes down.
    preemptions: Preemptions,
}

/// The engine's preemption count as a counter of llmslo's: it only grows.
#[derive(Debug, Default, Clone, Copy)]
struct Preemptions {
    /// The engine's figure on the last page that stated one.
    last: Option<f64>,
    /// llmslo's counter.
    total: f64,
}

impl Preemptions {
    /// Takes the engine's figure on a new page: its growth is added; a lower figure is an
    /// engine that restarted, counting from zero again.
    fn read(&mut self, engine: f64) {
        self.total += match self.last {
            Some(last) if engine >= last => engine - last,
            _ => engine,
        };
        self.last = Some(engine);
    }
}

/// The engine's `/metrics` as last read, shared by the scraper, the exposition and requests.
#[derive(Debug)]
pub struct EngineView {
    mode: EngineMetricsMode,
    state: RwLock<ViewState>,
    /// Samples of the last merge left out because their names are llmslo's.
    collided: AtomicU64,
}

impl EngineView {
    /// A view that reads the engine as `mode` says.
    pub fn new(mode: EngineMetricsMode) -> Arc<Self> {
        Arc::new(Self {
            mode,
            state: RwLock::default(),
            collided: AtomicU64::new(0),
        })
    }

    /// What llmslo does with the engine's `/metrics`.
    pub fn mode(&self) -> EngineMetricsMode {
        self.mode
    }

    /// Takes a page read in `took`.
    pub fn update(&self, page: Page, took: Duration) {
        let signals = Signals::read(&page);
        let mut state = self.state.write().expect("engine view lock");
        state.prefix_cache_hit_ratio = signals.prefix_cache_hit_ratio_since(state.signals.as_ref());
        if let Some(preemptions) = signals.preemptions {
            state.preemptions.read(preemptions);
        }
        state.signals = Some(signals);
        state.dropped = page.dropped;
        state.samples = page.families.iter().map(|f| f.samples.len()).sum();
        state.page = (self.mode == EngineMetricsMode::Merge).then(|| Arc::new(page));
        state.up = Some(true);
        state.duration = took.as_secs_f64();
    }

    /// Notes a scrape that failed after `took`: nothing the engine said before is exported
    /// until a scrape succeeds again (llmslo's preemption counter keeps its count).
    pub fn failed(&self, took: Duration) {
        let mut state = self.state.write().expect("engine view lock");
        *state = ViewState {
            up: Some(false),
            duration: took.as_secs_f64(),
            preemptions: state.preemptions,
            ..ViewState::default()
        };
    }

    /// The engine now, as its last good page showed it.
    pub fn moment(&self) -> EngineMoment {
        let state = self.state.read().expect("engine view lock");
        state.signals.map_or_else(EngineMoment::default, |s| EngineMoment {
            waiting: s.waiting,
            preemptions: s.preemptions,
            running: s.running,
        })
    }

    /// The last good page as OpenMetrics families, without any that would write a series
    /// name `own` (llmslo's OpenMetrics exposition) holds; empty unless `merge` is on.
    pub fn merged_families(&self, own: &str) -> String {
        let page = self.state.read().expect("engine view lock").page.clone();
        let Some(page) = page else {
            return String::new();
        };
        let mut out = String::new();
        let collided = exposition::write_openmetrics(&page, &OwnNames::of_openmetrics(own), &mut out);
        self.collided.store(collided, Ordering::Relaxed);
        out
    }

    /// The last good page as protobuf families, without any that would write a series name
    /// of the families named `own`; empty unless `merge` is on.
    pub fn merged_protobuf<'a>(&self, own: impl IntoIterator<Item = &'a str>) -> Vec<crate::proto::MetricFamily> {
        let page = self.state.read().expect("engine view lock").page.clone();
        let Some(page) = page else {
            return Vec::new();
        };
        let (families, collided) = protobuf::families(&page, &OwnNames::new(own));
        self.collided.store(collided, Ordering::Relaxed);
        families
    }
}

/// Exports the view's scrape status and mapped signals.
#[derive(Debug)]
pub struct EngineCollector(pub Arc<EngineView>);

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.mode == EngineMetricsMode::Off {
            return Ok(());
        }
        let state = self.0.state.read().expect("engine view lock");
        let Some(up) = state.up else {
            return Ok(());
        };
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64| {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)
        };
        gauge(
            &mut encoder,
            "llmslo_engine_scrape_up",
            "Whether the last read of the engine's /metrics succeeded (1) or not (0); the llmslo_engine_* \
             signals are absent while it is 0",
            f64::from(u8::from(up)),
        )?;
        gauge(
            &mut encoder,
            "llmslo_engine_scrape_duration_seconds",
            "How long the last read of the engine's /metrics took",
            state.duration,
        )?;
        let Some(signals) = state.signals else {
            return Ok(());
        };
        let mapped: [(&str, &str, Option<f64>); 4] = [
            (
                "llmslo_engine_requests_waiting",
                "Requests waiting in the engine's queue, as the engine's /metrics states it",
                signals.waiting,
            ),
            (
                "llmslo_engine_requests_running",
                "Requests the engine is running (its batch), as its /metrics states it",
                signals.running,
            ),
            (
                "llmslo_engine_kv_cache_usage_ratio",
                "Share of the engine's KV cache in use (0 to 1), as its /metrics states it",
                signals.kv_cache_usage,
            ),
            (
                "llmslo_engine_prefix_cache_hit_ratio",
                "Share of prefix-cache lookups that hit, between the engine's last two pages (or as the engine \
                 states it)",
                state.prefix_cache_hit_ratio,
            ),
        ];
        for (name, help, value) in mapped {
            if let Some(value) = value {
                gauge(&mut encoder, name, help, value)?;
            }
        }
        if signals.preemptions.is_some() {
            let family = encoder.encode_descriptor(
                "llmslo_engine_preemptions",
                "Requests the engine preempted (KV cache full), as its /metrics states it; carried on \
                 across the engine's restarts, so it never goes down",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(state.preemptions.total).encode(family)?;
        }
        gauge(
            &mut encoder,
            "llmslo_engine_page_samples",
            "Samples kept from the engine's last /metrics page",
            state.samples as f64,
        )?;
        let dropped = state.dropped;
        let family = encoder.encode_descriptor(
            "llmslo_engine_page_samples_dropped",
            "Lines of the engine's last /metrics page left out, by why: malformed (not the text format's \
             grammar, or a series twice), invalid_value (a family with an impossible count), reserved_name \
             (named under llmslo_ or gen_ai_), collision (with merge: a series name llmslo's own exposition \
             holds)",
            None,
            MetricType::Gauge,
        )?;
        let mut family = family;
        for (reason, count) in [
            ("collision", self.0.collided.load(Ordering::Relaxed)),
            ("invalid_value", dropped.invalid_value),
            ("malformed", dropped.malformed),
            ("reserved_name", dropped.reserved_name),
        ] {
            let labels = [("reason", reason)];
            ConstGauge::new(count as f64).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::EngineContext;

    fn page(waiting: u32, preemptions: u32) -> Page {
        exposition::parse(
            &format!(
                "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {waiting}\n\
                 # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running {}\n\
                 # TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total {preemptions}\n",
                preemptions + 1
            ),
            100,
        )
        .unwrap()
    }

    #[test]
    fn llmslos_preemption_counter_never_goes_down() {
        let view = EngineView::new(EngineMetricsMode::Map);
        let total = |view: &EngineView| view.state.read().unwrap().preemptions.total;
        view.update(page(0, 5), Duration::ZERO);
        assert_eq!(total(&view), 5.0);
        view.update(page(0, 7), Duration::ZERO);
        view.failed(Duration::ZERO);
        view.update(page(0, 2), Duration::ZERO);
        assert_eq!(total(&view), 9.0, "the engine restarted and preempted two more");
    }

    #[test]
    fn a_request_sees_the_queue_at_arrival_and_preemptions_while_it_ran() {
        let view = EngineView::new(EngineMetricsMode::Map);
        assert_eq!(view.moment(), EngineMoment::default(), "nothing before the first page");
        view.update(page(4, 1), Duration::from_millis(3));
        let arrival = view.moment();
        view.update(page(0, 2), Duration::from_millis(3));
        let context = EngineContext::between(arrival, view.moment());
        assert_eq!(context.waiting_at_arrival, Some(4.0));
        assert!(context.preemptions_during);
        assert_eq!(context.running, Some(3.0), "the larger batch of the two pages");
        assert!(!EngineContext::between(view.moment(), view.moment()).preemptions_during);
    }

    #[test]
    fn a_failed_scrape_forgets_the_engine_until_the_next_good_one() {
        let view = EngineView::new(EngineMetricsMode::Merge);
        view.update(page(4, 1), Duration::from_millis(3));
        assert!(view.merged_families("").contains("vllm:num_requests_waiting 4.0"));
        view.failed(Duration::from_secs(2));
        assert_eq!(view.moment(), EngineMoment::default());
        assert_eq!(view.merged_families(""), "");
    }
}
