//! Which exposition a scraper gets from `/metrics`, from its `Accept` header.

use http::HeaderValue;

/// The exposition formats of `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus's delimited protobuf, with native histograms.
    Protobuf,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Prometheus's classic text format 0.0.4.
    Classic,
}

/// The format `accept` ranks highest: protobuf only above every text format (what a
/// Prometheus with native histograms sends), OpenMetrics when asked for by name at least as
/// high as plain text (what every Prometheus sends), else the classic text, which is also
/// what a client with no preference (`*/*`, no header) gets.
pub fn negotiate(accept: Option<&HeaderValue>) -> Format {
    let Some(accept) = accept.and_then(|v| v.to_str().ok()) else {
        return Format::Classic;
    };
    let (mut protobuf, mut openmetrics, mut classic) = (0.0_f64, 0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or_default().to_ascii_lowercase();
        let (mut q, mut proto, mut delimited) = (1.0, false, false);
        for param in parts {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => q = value.parse().unwrap_or(0.0),
                "proto" => proto = value == "io.prometheus.client.MetricFamily",
                "encoding" => delimited = value == "delimited",
                _ => {}
            }
        }
        match media_type.as_str() {
            "application/vnd.google.protobuf" if proto && delimited => protobuf = protobuf.max(q),
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => classic = classic.max(q),
            _ => {}
        }
    }
    if protobuf > 0.0 && protobuf > openmetrics.max(classic) {
        Format::Protobuf
    } else if openmetrics > 0.0 && openmetrics >= classic {
        Format::OpenMetrics
    } else {
        Format::Classic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(accept: &str) -> Format {
        negotiate(Some(&HeaderValue::from_str(accept).unwrap()))
    }

    #[test]
    fn protobuf_only_when_ranked_above_text() {
        // Prometheus 2.42 with native histograms enabled.
        assert_eq!(
            format(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,\
                 text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
            ),
            Format::Protobuf
        );
        // Prometheus 3 with `scrape_protocols: [PrometheusProto, OpenMetricsText1.0.0]`.
        assert_eq!(
            format(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,\
                 application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.4"
            ),
            Format::Protobuf
        );
        // Ranked below text, the wrong message, the length-prefix framing missing, q=0.
        for accept in [
            "text/plain;q=0.9,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5",
            "application/vnd.google.protobuf;proto=other.Message;encoding=delimited",
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily",
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0",
            "application/vnd.google.protobuf;;q=oops,,",
        ] {
            assert_ne!(format(accept), Format::Protobuf, "{accept}");
        }
    }

    #[test]
    fn openmetrics_when_asked_for_by_name_else_the_classic_text() {
        // Prometheus without native histograms.
        assert_eq!(
            format(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                 text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            ),
            Format::OpenMetrics
        );
        assert_eq!(format("application/openmetrics-text"), Format::OpenMetrics);
        // curl, promtool's users, a browser, an old scraper, no header.
        assert_eq!(format("*/*"), Format::Classic);
        assert_eq!(format("text/plain;version=0.0.4"), Format::Classic);
        assert_eq!(
            format("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
            Format::Classic
        );
        assert_eq!(
            format("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"),
            Format::Classic
        );
        assert_eq!(negotiate(None), Format::Classic);
    }
}
