//! Prometheus's classic text format (version 0.0.4), written from the OpenMetrics page, for
//! the clients that do not ask for OpenMetrics: `curl`, `promtool check metrics`, and any
//! scraper that sends no preference. The samples are the same; what differs is spelling:
//! a counter's family is named with its `_total`, an info family with its `_info` (a gauge),
//! a state set is a gauge, `_created` samples, units, exemplars and `# EOF` are left out.

/// The content type of the classic text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The classic text page of an OpenMetrics page that llmslo wrote itself.
pub fn from_openmetrics(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    // The family being copied (its OpenMetrics name), and a HELP line waiting for its TYPE,
    // which decides the name it is written under.
    let mut family = "";
    let mut help: Option<(&str, &str)> = None;
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (keyword, name, text) = (
                words.next().unwrap_or_default(),
                words.next().unwrap_or_default(),
                words.next().unwrap_or_default(),
            );
            match keyword {
                "HELP" => help = Some((name, text)),
                "TYPE" => {
                    family = name;
                    let (classic, kind) = classic_family(name, text);
                    if let Some((_, text)) = help.take().filter(|(helped, _)| *helped == name) {
                        out.push_str(&format!("# HELP {classic} {}\n", classic_help(text)));
                    }
                    out.push_str(&format!("# TYPE {classic} {kind}\n"));
                }
                // UNIT and EOF have no place in the classic format.
                _ => {}
            }
            continue;
        }
        let sample = without_exemplar(line);
        let name = &sample[..sample.find(['{', ' ']).unwrap_or(sample.len())];
        if name.ends_with("_created") && name != family {
            continue;
        }
        out.push_str(sample);
        out.push('\n');
    }
    out
}

/// The classic name and type of an OpenMetrics family.
fn classic_family<'a>(name: &'a str, kind: &'a str) -> (std::borrow::Cow<'a, str>, &'a str) {
    match kind {
        "counter" => (format!("{name}_total").into(), "counter"),
        "info" => (format!("{name}_info").into(), "gauge"),
        "stateset" => (name.into(), "gauge"),
        "gauge" | "histogram" | "summary" => (name.into(), kind),
        _ => (name.into(), "untyped"),
    }
}

/// HELP text: OpenMetrics may escape a double quote, the classic format does not.
fn classic_help(text: &str) -> String {
    text.replace("\\\"", "\"")
}

/// A sample line without its exemplar (` # {labels} value [timestamp]` after the value),
/// found outside the quoted label values.
fn without_exemplar(line: &str) -> &str {
    let mut in_quotes = false;
    let mut escaped = false;
    let mut labels_closed = !line.contains('{');
    for (i, c) in line.char_indices() {
        if !labels_closed {
            match (in_quotes, escaped, c) {
                (true, true, _) => escaped = false,
                (true, false, '\\') => escaped = true,
                (_, false, '"') => in_quotes = !in_quotes,
                (false, _, '}') => labels_closed = true,
                _ => {}
            }
            continue;
        }
        if c == '#' {
            return line[..i].trim_end();
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_renamed_and_openmetrics_only_lines_left_out() {
        let page = "# HELP llmslo_requests Requests, by \\\"outcome\\\".\n\
                    # TYPE llmslo_requests counter\n\
                    llmslo_requests_total{outcome=\"success\"} 3\n\
                    llmslo_requests_created{outcome=\"success\"} 1.7e9\n\
                    # HELP llmslo_build Build.\n\
                    # TYPE llmslo_build info\n\
                    llmslo_build_info{version=\"0.1.0\"} 1\n\
                    # HELP llmslo_ttft_seconds TTFT.\n\
                    # TYPE llmslo_ttft_seconds histogram\n\
                    # UNIT llmslo_ttft_seconds seconds\n\
                    llmslo_ttft_seconds_bucket{le=\"0.1\"} 1 # {trace_id=\"ab # {c}\"} 0.05 1.7e9\n\
                    llmslo_ttft_seconds_bucket{le=\"+Inf\"} 1\n\
                    llmslo_ttft_seconds_sum 0.05\n\
                    llmslo_ttft_seconds_count 1\n\
                    llmslo_ttft_seconds_created 1.7e9\n\
                    # HELP odd Odd.\n\
                    # TYPE odd unknown\n\
                    odd{path=\"a # {b}\"} 1\n\
                    # EOF\n";
        assert_eq!(
            from_openmetrics(page),
            "# HELP llmslo_requests_total Requests, by \"outcome\".\n\
             # TYPE llmslo_requests_total counter\n\
             llmslo_requests_total{outcome=\"success\"} 3\n\
             # HELP llmslo_build_info Build.\n\
             # TYPE llmslo_build_info gauge\n\
             llmslo_build_info{version=\"0.1.0\"} 1\n\
             # HELP llmslo_ttft_seconds TTFT.\n\
             # TYPE llmslo_ttft_seconds histogram\n\
             llmslo_ttft_seconds_bucket{le=\"0.1\"} 1\n\
             llmslo_ttft_seconds_bucket{le=\"+Inf\"} 1\n\
             llmslo_ttft_seconds_sum 0.05\n\
             llmslo_ttft_seconds_count 1\n\
             # HELP odd Odd.\n\
             # TYPE odd untyped\n\
             odd{path=\"a # {b}\"} 1\n"
        );
    }

    #[test]
    fn a_gauge_named_created_is_kept() {
        let page = "# HELP jobs_created Jobs made.\n# TYPE jobs_created gauge\njobs_created 4\n# EOF\n";
        assert!(from_openmetrics(page).contains("\njobs_created 4\n"));
    }
}
