//! The engine's page as Prometheus's protobuf messages, for `engine_metrics: merge` when the
//! scraper asks for the protobuf exposition (native histograms): the same families the
//! OpenMetrics merge writes, each sample's labels parsed into pairs.

use super::exposition::{group_by, label_pairs, mergeable, without_label, Family, Kind, OwnNames, Page, Sample};
use crate::proto;

/// The mergeable families of `page` as protobuf messages (the same the OpenMetrics merge
/// writes), and how many samples were left out for a name `own` holds.
pub fn families(page: &Page, own: &OwnNames) -> (Vec<proto::MetricFamily>, u64) {
    let (families, collided) = mergeable(page, own);
    (families.into_iter().map(|(f, _, _)| family(f)).collect(), collided)
}

fn family(f: &Family) -> proto::MetricFamily {
    let (kind, metric) = match f.kind {
        Kind::Counter => (proto::MetricType::Counter, plain(f, counter)),
        Kind::Gauge => (proto::MetricType::Gauge, plain(f, gauge)),
        Kind::Histogram => (proto::MetricType::Histogram, histograms(f)),
        Kind::Summary => (proto::MetricType::Summary, summaries(f)),
        Kind::Untyped => (proto::MetricType::Untyped, plain(f, untyped)),
    };
    proto::MetricFamily {
        name: f.name.clone(),
        help: f.help.clone().unwrap_or_default(),
        r#type: kind as i32,
        metric,
        unit: String::new(),
    }
}

fn counter(value: f64) -> proto::Metric {
    proto::Metric {
        counter: Some(proto::Counter {
            value,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn gauge(value: f64) -> proto::Metric {
    proto::Metric {
        gauge: Some(proto::Gauge { value }),
        ..Default::default()
    }
}

fn untyped(value: f64) -> proto::Metric {
    proto::Metric {
        untyped: Some(proto::Untyped { value }),
        ..Default::default()
    }
}

/// One metric per sample (a counter's `_created` samples are left to its family).
fn plain(f: &Family, make: impl Fn(f64) -> proto::Metric) -> Vec<proto::Metric> {
    f.samples
        .iter()
        .filter(|s| s.suffix != "_created")
        .map(|s| proto::Metric {
            label: pairs(&s.labels),
            ..make(s.value)
        })
        .collect()
}

/// One metric per series: the samples whose labels but `per_series` agree (grouped by a hash
/// of the rest, in one pass), each given to `add`.
fn grouped(f: &Family, per_series: &str, mut add: impl FnMut(&mut proto::Metric, &Sample)) -> Vec<proto::Metric> {
    let series = group_by(f.samples.iter().map(|s| (without_label(&s.labels, per_series), s)));
    series
        .into_iter()
        .map(|samples| {
            let mut metric = proto::Metric {
                label: pairs(&without_label(&samples[0].labels, per_series)),
                ..Default::default()
            };
            for sample in samples {
                add(&mut metric, sample);
            }
            metric
        })
        .collect()
}

fn histograms(f: &Family) -> Vec<proto::Metric> {
    grouped(f, "le", |metric, s| {
        let histogram = metric.histogram.get_or_insert_with(Default::default);
        match s.suffix {
            "_bucket" => {
                if let Some(upper_bound) = bound(&s.labels, "le") {
                    histogram.bucket.push(proto::Bucket {
                        cumulative_count: s.value as u64,
                        upper_bound,
                        ..Default::default()
                    });
                }
            }
            "_sum" => histogram.sample_sum = s.value,
            "_count" => histogram.sample_count = s.value as u64,
            _ => {}
        }
    })
}

fn summaries(f: &Family) -> Vec<proto::Metric> {
    grouped(f, "quantile", |metric, s| {
        let summary = metric.summary.get_or_insert_with(Default::default);
        match s.suffix {
            "" => {
                if let Some(quantile) = bound(&s.labels, "quantile") {
                    summary.quantile.push(proto::Quantile {
                        quantile,
                        value: s.value,
                    });
                }
            }
            "_sum" => summary.sample_sum = s.value,
            "_count" => summary.sample_count = s.value as u64,
            _ => {}
        }
    })
}

/// A bucket's `le` or a summary's `quantile`.
fn bound(labels: &str, key: &str) -> Option<f64> {
    let pairs = label_pairs(labels);
    let value = &pairs.iter().find(|(name, _)| name == key)?.1;
    match value.as_str() {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        v => v.parse().ok(),
    }
}

/// The label pairs of a sample's label text.
fn pairs(labels: &str) -> Vec<proto::LabelPair> {
    label_pairs(labels)
        .into_iter()
        .map(|(name, value)| proto::LabelPair { name, value })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::exposition::parse;
    use std::collections::HashSet;

    fn page(text: &str) -> Page {
        parse(text, 20_000).unwrap()
    }

    #[test]
    fn a_real_vllm_page_becomes_valid_protobuf_families() {
        let page = page(include_str!("../../tests/fixtures/vllm-0.32-metrics.txt"));
        let (out, collided) = families(&page, &OwnNames::new(["process_cpu_seconds_total"]));
        assert_eq!(collided, 1);
        let find = |name: &str| out.iter().find(|f| f.name == name);
        assert!(find("process_cpu_seconds_total").is_none(), "llmslo's name wins");
        assert!(find("vllm:num_preemptions_created").is_none());
        let preemptions = find("vllm:num_preemptions_total").unwrap();
        assert_eq!(preemptions.r#type, proto::MetricType::Counter as i32);
        let labels = &preemptions.metric[0].label;
        assert_eq!((labels[0].name.as_str(), labels[0].value.as_str()), ("engine", "0"));
        let ttft = find("vllm:time_to_first_token_seconds").unwrap();
        let h = ttft.metric[0].histogram.as_ref().unwrap();
        assert!(ttft.metric[0].label.iter().all(|l| l.name != "le"));
        assert!(h.bucket.windows(2).all(|w| w[0].upper_bound < w[1].upper_bound));
        assert_eq!(h.bucket.last().unwrap().upper_bound, f64::INFINITY);
        assert_eq!(h.bucket.last().unwrap().cumulative_count, h.sample_count);
        let names: HashSet<&str> = out.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names.len(), out.len(), "no family twice");
        let sizes = find("http_request_size_bytes").unwrap();
        assert_eq!(sizes.metric.len(), 2, "one series per handler");
        let chat = sizes.metric[1].summary.as_ref().unwrap();
        assert_eq!((chat.sample_count, chat.sample_sum), (1, 173.0));
    }

    #[test]
    fn a_summarys_quantiles_stay_with_their_series() {
        let page = page(
            "# TYPE s summary\ns{h=\"a\",quantile=\"0.5\"} 2\ns{h=\"a\",quantile=\"0.99\"} 9\ns_sum{h=\"a\"} 30\n\
             s_count{h=\"a\"} 10\n",
        );
        let (out, _) = families(&page, &OwnNames::default());
        let summary = out[0].metric[0].summary.as_ref().unwrap();
        assert_eq!(out[0].metric.len(), 1);
        assert_eq!(summary.quantile.len(), 2);
        assert_eq!((summary.quantile[1].quantile, summary.quantile[1].value), (0.99, 9.0));
        assert_eq!((summary.sample_count, summary.sample_sum), (10, 30.0));
    }

    #[test]
    fn escaped_label_values_are_unescaped() {
        let page = page("# TYPE x gauge\nx{a=\"q\\\"u\\\\o\\nte\",b=\"2\"} 1\n");
        let (out, _) = families(&page, &OwnNames::default());
        let labels = &out[0].metric[0].label;
        assert_eq!(labels[0].value, "q\"u\\o\nte");
        assert_eq!(labels[1].value, "2");
    }
}
