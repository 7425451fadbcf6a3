//! The engine's `/metrics` as Prometheus's text format (0.0.4) writes it, read into families:
//! enough to find the few series llmslo maps, and to write the whole page again as
//! OpenMetrics beside llmslo's own families.
//!
//! Written here rather than taken from a crate: the crates that parse the format give values
//! without the lines they came from, and the merge needs each sample's text unchanged.

use std::collections::HashSet;
use std::fmt::Write;

/// One metric family: its samples, in the order the engine wrote them.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The family's name as `# TYPE` gave it (or the sample name of an untyped sample).
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: String,
    /// `# HELP`'s text, as written (0.0.4 escaping).
    pub help: Option<String>,
    /// Its samples.
    pub samples: Vec<Sample>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's metric name (`x_bucket`, `x_total`, …).
    pub name: String,
    /// The text between the braces, as written (empty without labels).
    pub labels: String,
    /// Its value.
    pub value: f64,
}

/// A page that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The 1-based line.
    pub line: usize,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// Reads a text-format page. Samples belong to the family `# TYPE` last named when their
/// name is that family's (with a suffix its type allows); any other sample starts an untyped
/// family of its own. A family met a second time is merged into the first.
pub fn parse(text: &str) -> Result<Vec<Family>, ParseError> {
    let mut families: Vec<Family> = Vec::new();
    let mut help: Option<(String, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let error = |reason| ParseError {
            line: index + 1,
            reason,
        };
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("HELP"), Some(name), text) => help = Some((name.to_string(), text.unwrap_or("").to_string())),
                (Some("TYPE"), Some(name), Some(kind)) => {
                    let kind = kind.trim();
                    if !matches!(kind, "counter" | "gauge" | "histogram" | "summary" | "untyped") {
                        return Err(error("an unknown # TYPE"));
                    }
                    let help = help.take().filter(|(of, _)| of == name).map(|(_, text)| text);
                    match families.iter_mut().find(|f| f.name == name) {
                        Some(family) if family.kind == kind => {}
                        Some(_) => return Err(error("a family typed twice, differently")),
                        None => families.push(Family {
                            name: name.to_string(),
                            kind: kind.to_string(),
                            help,
                            samples: Vec::new(),
                        }),
                    }
                }
                _ => {}
            }
            continue;
        }
        let sample = sample(line).ok_or_else(|| error("not a sample: `name{labels} value`"))?;
        let owner = families
            .iter()
            .rposition(|f| belongs(&sample.name, f))
            .unwrap_or_else(|| {
                families.push(Family {
                    name: sample.name.clone(),
                    kind: "untyped".to_string(),
                    help: None,
                    samples: Vec::new(),
                });
                families.len() - 1
            });
        families[owner].samples.push(sample);
    }
    Ok(families)
}

/// Whether a sample named `name` is one of `family`'s.
fn belongs(name: &str, family: &Family) -> bool {
    let Some(suffix) = name.strip_prefix(family.name.as_str()) else {
        return false;
    };
    match family.kind.as_str() {
        "histogram" => matches!(suffix, "_bucket" | "_sum" | "_count"),
        "summary" => matches!(suffix, "" | "_sum" | "_count"),
        _ => suffix.is_empty(),
    }
}

/// `name{labels} value [timestamp]`; `None` when the line is not one.
fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c.is_ascii_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return None;
    }
    let rest = &line[name_end..];
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => {
            let close = closing_brace(inner)?;
            (&inner[..close], &inner[close + 1..])
        }
        None => ("", rest),
    };
    let value = rest.split_ascii_whitespace().next()?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels: labels.to_string(),
        value,
    })
}

/// Where the label set that `text` continues ends: the first `}` outside a quoted value.
fn closing_brace(text: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The (name, value) pairs of a sample's label text, values unescaped.
pub fn label_pairs(labels: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches([',', ' ']).trim();
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                '"' => {
                    end = Some(eq + 2 + i);
                    break;
                }
                c => value.push(c),
            }
        }
        let Some(end) = end else { break };
        out.push((name.to_string(), value));
        rest = &rest[end + 1..];
    }
    out
}

/// Writes `families` as OpenMetrics families (without `# EOF`), leaving out every family
/// whose OpenMetrics name is in `taken` (llmslo's own keep their names) and the
/// `*_created` gauges the Python client writes beside its counters and histograms
/// (OpenMetrics carries those inside the family).
pub fn write_openmetrics(families: &[Family], taken: &HashSet<String>, out: &mut String) {
    let typed = typed_names(families);
    let mut written: HashSet<String> = HashSet::new();
    for family in families {
        if family.samples.is_empty() {
            continue;
        }
        if family.kind == "gauge"
            && family
                .name
                .strip_suffix("_created")
                .is_some_and(|of| typed.contains(of))
        {
            continue;
        }
        let (name, kind) = openmetrics_name(family);
        if taken.contains(&name) || !written.insert(name.clone()) {
            continue;
        }
        if let Some(help) = &family.help {
            let _ = writeln!(out, "# HELP {name} {}", help.replace('"', "\\\""));
        }
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for sample in &family.samples {
            out.push_str(&sample.name);
            if !sample.labels.is_empty() {
                let _ = write!(out, "{{{}}}", sample.labels);
            }
            let _ = writeln!(out, " {}", openmetrics_value(sample.value));
        }
    }
}

/// The names a `*_created` gauge of the Python client may belong to: counters without
/// `_total`, histograms and summaries.
fn typed_names(families: &[Family]) -> HashSet<&str> {
    families
        .iter()
        .filter_map(|f| match f.kind.as_str() {
            "counter" => Some(f.name.strip_suffix("_total").unwrap_or(&f.name)),
            "histogram" | "summary" => Some(f.name.as_str()),
            _ => None,
        })
        .collect()
}

fn is_created_gauge_of(family: &Family, typed: &HashSet<&str>) -> bool {
    family.kind == "gauge"
        && family
            .name
            .strip_suffix("_created")
            .is_some_and(|of| typed.contains(of))
}

/// Whether `family` is a `*_created` gauge the Python client writes beside a counter,
/// histogram or summary of `page` (OpenMetrics and protobuf carry that time in the family).
pub fn is_created_gauge(family: &Family, page: &[Family]) -> bool {
    is_created_gauge_of(family, &typed_names(page))
}

/// A family's OpenMetrics name and type: a counter is named without `_total` (its samples
/// keep it); a counter whose samples lack it, and anything untyped, is `unknown`.
fn openmetrics_name(family: &Family) -> (String, &'static str) {
    match family.kind.as_str() {
        "counter" => match family.name.strip_suffix("_total") {
            Some(base) if family.samples.iter().all(|s| s.name == family.name) => (base.to_string(), "counter"),
            _ => (family.name.clone(), "unknown"),
        },
        "gauge" => (family.name.clone(), "gauge"),
        "histogram" => (family.name.clone(), "histogram"),
        "summary" => (family.name.clone(), "summary"),
        _ => (family.name.clone(), "unknown"),
    }
}

fn openmetrics_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value == f64::INFINITY {
        "+Inf".to_string()
    } else if value == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else {
        format!("{value:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = include_str!("../../tests/fixtures/vllm-0.32-metrics.txt");

    #[test]
    fn a_real_vllm_page_reads_into_its_families() {
        let families = parse(VLLM).unwrap();
        let find = |name: &str| families.iter().find(|f| f.name == name).unwrap();
        let waiting = find("vllm:num_requests_waiting");
        assert_eq!(waiting.kind, "gauge");
        assert_eq!(waiting.samples.len(), 1);
        assert!(label_pairs(&waiting.samples[0].labels).contains(&("model_name".into(), "tiny".into())));
        let ttft = find("vllm:time_to_first_token_seconds");
        assert_eq!(ttft.kind, "histogram");
        assert!(ttft.samples.iter().any(|s| s.name.ends_with("_bucket")));
        assert!(ttft.samples.iter().any(|s| s.name.ends_with("_count")));
        assert!(
            families.iter().all(|f| f.kind != "untyped"),
            "every sample found its typed family"
        );
    }

    #[test]
    fn labels_with_braces_spaces_and_escapes_are_read_whole() {
        let page = "# TYPE x gauge\nx{a=\"}{ \\\" \",b=\"2\"} 3 1700000000000\ny 1e3\n";
        let families = parse(page).unwrap();
        assert_eq!(families[0].samples[0].value, 3.0);
        let pairs = label_pairs(&families[0].samples[0].labels);
        assert_eq!(
            pairs,
            [("a".to_string(), "}{ \" ".to_string()), ("b".into(), "2".into())]
        );
        assert_eq!((families[1].name.as_str(), families[1].kind.as_str()), ("y", "untyped"));
        assert_eq!(families[1].samples[0].value, 1000.0);
    }

    #[test]
    fn garbage_is_refused_with_its_line() {
        assert_eq!(parse("# TYPE x gauge\nx{a=\"1\" 2\n").unwrap_err().line, 2);
        assert_eq!(
            parse("x one\n").unwrap_err().reason,
            "not a sample: `name{labels} value`"
        );
        assert_eq!(parse("# TYPE x dial\n").unwrap_err().line, 1);
        assert!(parse("<html>oops</html>\n").is_err());
    }

    #[test]
    fn openmetrics_names_counters_without_total_and_drops_created_gauges() {
        let families = parse(VLLM).unwrap();
        let mut out = String::new();
        let taken: HashSet<String> = ["process_cpu_seconds".to_string()].into();
        write_openmetrics(&families, &taken, &mut out);
        assert!(out.contains("# TYPE vllm:num_preemptions counter\n"));
        assert!(out.contains("\nvllm:num_preemptions_total{engine=\"0\",model_name=\"tiny\"} 0.0\n"));
        assert!(!out.contains("vllm:num_preemptions_created"));
        assert!(
            !out.contains("vllm:iteration_tokens_total_created"),
            "a histogram's too"
        );
        assert!(out.contains("# TYPE vllm:iteration_tokens_total histogram\n"));
        assert!(out.contains("# TYPE vllm:time_to_first_token_seconds histogram\n"));
        assert!(!out.contains("# TYPE process_cpu_seconds"));
        let types = out.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let names: HashSet<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        assert_eq!(types, names.len(), "no family twice");
    }
}
