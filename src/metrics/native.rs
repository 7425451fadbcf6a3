//! Native (exponential) histograms beside the classic buckets, and the protobuf exposition
//! that carries both to a scraper that asks for it.
//!
//! Schema 4: each bucket is 2^(1/16) ≈ 1.044 times as wide as the one below, so a quantile read
//! from the buckets is never further than one bucket (4.4 %) from the truth, wherever the values
//! sit. Go's default factor of 1.1 (schema 3) allows 9 %, too coarse to keep even a constant
//! TPOT's p99 within 5 %. A series keeps at most 160 populated buckets (OpenTelemetry's default
//! for exponential histograms): ten octaves at full resolution, 1 ms to 1 s of TPOT or 50 ms to
//! 50 s of TTFT. A wider spread halves the resolution (schema 3, twenty octaves), and so on;
//! the resolution never comes back up, so no series is ever reset.
//!
//! prometheus-client keeps exemplars only on classic histograms. The latency families that link
//! to traces therefore keep each series' native buckets in a twin (same name and labels, in a
//! second registry), and [`encode_protobuf`] copies each twin's native buckets into its series.

use super::buckets::Buckets;
use crate::proto;
use prometheus_client::encoding::prometheus_protobuf;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::{Histogram, NativeHistogramConfig};
use prometheus_client::registry::{Registry, Unit};
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;

/// Native histogram schema: buckets grow by 2^(2^-4) ≈ 1.044.
pub const SCHEMA: i8 = 4;

/// Populated native buckets a series keeps before it halves its resolution.
const MAX_BUCKETS: usize = 160;

/// The native half of every histogram.
fn config() -> NativeHistogramConfig {
    NativeHistogramConfig::with_schema(SCHEMA).max_buckets(MAX_BUCKETS)
}

/// Builds histograms with both the family's classic buckets and native buckets.
#[derive(Debug, Clone)]
pub struct ClassicAndNative(pub Buckets);

impl MetricConstructor<Histogram> for ClassicAndNative {
    fn new_metric(&self) -> Histogram {
        Histogram::new_classic_and_native(self.0.edges().iter().copied(), config())
    }
}

/// Builds the native-only twin of a series with exemplars.
#[derive(Debug, Clone, Copy, Default)]
struct NativeOnly;

impl MetricConstructor<Histogram> for NativeOnly {
    fn new_metric(&self) -> Histogram {
        Histogram::new_native(config())
    }
}

/// A histogram family whose classic buckets keep the trace of their latest sampled
/// observation, with a native twin per series.
#[derive(Debug, Clone)]
pub struct ExemplarHistograms<L: Clone + Hash + Eq, E> {
    classic: Family<L, HistogramWithExemplars<E>, Buckets>,
    native: Family<L, Histogram, NativeOnly>,
}

impl<L, E> ExemplarHistograms<L, E>
where
    L: Clone + Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    E: EncodeLabelSet + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    /// An empty family with `buckets` as its classic edges.
    pub fn new(buckets: Buckets) -> Self {
        Self {
            classic: Family::new_with_constructor(buckets),
            native: Family::new_with_constructor(NativeOnly),
        }
    }

    /// Observes `value` in the series `labels`, keeping `exemplar` on its classic bucket.
    pub fn observe(&self, labels: &L, value: f64, exemplar: Option<E>) {
        self.classic.get_or_create(labels).observe(value, exemplar, None);
        self.native.get_or_create(labels).observe(value);
    }

    /// Creates the series `labels` at zero.
    pub fn create(&self, labels: &L) {
        drop(self.classic.get_or_create(labels));
        drop(self.native.get_or_create(labels));
    }

    /// Registers the family, and its native twins beside it, under one name.
    pub fn register(&self, registry: &mut super::Registry, name: &str, help: &str, unit: Unit) {
        registry
            .families
            .register_with_unit(name, help, unit.clone(), self.classic.clone());
        registry.twins.register_with_unit(name, help, unit, self.native.clone());
    }
}

/// `registry` in the Prometheus protobuf exposition, each histogram of `twins`' families
/// given its native buckets, followed by the families `more` gives for the names taken.
pub fn encode_protobuf(
    registry: &Registry,
    twins: &Registry,
    more: impl FnOnce(&HashSet<String>) -> Vec<proto::MetricFamily>,
) -> Vec<u8> {
    let mut families = prometheus_protobuf::encode(registry).expect("encoding into memory cannot fail");
    let twins = prometheus_protobuf::encode(twins).expect("encoding into memory cannot fail");
    add_native_buckets(&mut families, twins);
    let own: HashSet<String> = families.iter().map(|f| f.name.clone()).collect();
    families.extend(more(&own));
    let mut out = Vec::with_capacity(64 * 1024);
    for family in &families {
        family.encode_length_delimited(&mut out).expect("a Vec grows as needed");
    }
    out
}

/// A series' identity: its family's name and its labels.
type SeriesKey = (String, Vec<(String, String)>);

fn series_key(family: &str, labels: &[proto::LabelPair]) -> SeriesKey {
    let labels = labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
    (family.to_string(), labels)
}

/// Gives each series of `families` the native buckets of the histogram in `twins` with the
/// same name and labels. The count and sum come from the twin too, so that they always
/// agree with its buckets (which Prometheus checks); a classic bucket may lag them by an
/// observation made between the two encodings, as any scrape may.
fn add_native_buckets(families: &mut [proto::MetricFamily], twins: Vec<proto::MetricFamily>) {
    let mut natives = HashMap::new();
    for family in twins {
        for metric in family.metric {
            if let Some(histogram) = metric.histogram {
                natives.insert(series_key(&family.name, &metric.label), histogram);
            }
        }
    }
    for family in families {
        for metric in &mut family.metric {
            let (Some(histogram), Some(native)) = (
                metric.histogram.as_mut(),
                natives.remove(&series_key(&family.name, &metric.label)),
            ) else {
                continue;
            };
            // The classic buckets (with their exemplars) stay; all else is the twin's.
            let bucket = std::mem::take(&mut histogram.bucket);
            *histogram = proto::Histogram { bucket, ..native };
        }
    }
}
