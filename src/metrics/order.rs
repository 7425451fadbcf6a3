//! A stable order for the exposition: prometheus-client writes each family's series in hash
//! order, which changes from scrape to scrape. Sorting them by their labels makes scrapes
//! diffable and readable, and keeps each series' samples (a histogram's buckets, sum and
//! count) together and in their order.

/// `text` (OpenMetrics from prometheus-client) with every family's series sorted by labels.
pub fn sorted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut series: Vec<(String, Vec<&str>)> = Vec::new();
    let flush = |series: &mut Vec<(String, Vec<&str>)>, out: &mut String| {
        series.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, lines) in series.drain(..) {
            for line in lines {
                out.push_str(line);
                out.push('\n');
            }
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut series, &mut out);
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let key = series_key(line);
        match series.last_mut() {
            Some((last, lines)) if *last == key => lines.push(line),
            _ => series.push((key, vec![line])),
        }
    }
    flush(&mut series, &mut out);
    out
}

/// A sample's labels without `le` and `quantile`: the same for every sample of one series.
fn series_key(line: &str) -> String {
    // A bucket's exemplar (` # {trace_id="…"} 0.43`) is not part of its series.
    let line = line.find(" # {").map_or(line, |at| &line[..at]);
    let labels = line
        .split_once('{')
        .and_then(|(_, rest)| rest.rsplit_once('}'))
        .map_or("", |(labels, _)| labels);
    labels
        .split("\",")
        .filter(|pair| !pair.starts_with("le=") && !pair.starts_with("quantile="))
        .collect::<Vec<_>>()
        .join("\",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_sorted_and_each_histogram_stays_whole() {
        let text = "# HELP h h.\n# TYPE h histogram\n\
                    h_sum{model=\"b\"} 1\nh_count{model=\"b\"} 1\nh_bucket{le=\"0.1\",model=\"b\"} 0\nh_bucket{le=\"+Inf\",model=\"b\"} 1\n\
                    h_sum{model=\"a\"} 2\nh_count{model=\"a\"} 2\nh_bucket{le=\"0.1\",model=\"a\"} 1\nh_bucket{le=\"+Inf\",model=\"a\"} 2\n\
                    # HELP c c.\n# TYPE c counter\nc_total{x=\"2\"} 5\nc_total{x=\"1\"} 4\n# EOF\n";
        let want = "# HELP h h.\n# TYPE h histogram\n\
                    h_sum{model=\"a\"} 2\nh_count{model=\"a\"} 2\nh_bucket{le=\"0.1\",model=\"a\"} 1\nh_bucket{le=\"+Inf\",model=\"a\"} 2\n\
                    h_sum{model=\"b\"} 1\nh_count{model=\"b\"} 1\nh_bucket{le=\"0.1\",model=\"b\"} 0\nh_bucket{le=\"+Inf\",model=\"b\"} 1\n\
                    # HELP c c.\n# TYPE c counter\nc_total{x=\"1\"} 4\nc_total{x=\"2\"} 5\n# EOF\n";
        assert_eq!(sorted(text), want);
    }
}
