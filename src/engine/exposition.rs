//! The engine's `/metrics` as Prometheus's text format (0.0.4) writes it, read strictly into
//! families: enough to find the few series llmslo maps, and to write the page again beside
//! llmslo's own families. The page is untrusted input: every line is checked against the
//! format's grammar and a line that fails is dropped and counted, never copied; label sets are
//! written again from what was parsed; impossible values (a negative counter) leave their
//! family out; names llmslo owns are never taken; and the work and memory are linear in the
//! page, with a cap on what is kept.
//!
//! Written here rather than taken from a crate: the crates that parse the format accept what
//! Prometheus itself would reject, and keep no count of what they dropped.

use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::hash::BuildHasher;

/// The type `# TYPE` gives a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `counter`.
    Counter,
    /// `gauge`.
    Gauge,
    /// `histogram`.
    Histogram,
    /// `summary`.
    Summary,
    /// `untyped`, or no `# TYPE` at all.
    Untyped,
}

impl Kind {
    fn parse(word: &str) -> Option<Kind> {
        Some(match word {
            "counter" => Kind::Counter,
            "gauge" => Kind::Gauge,
            "histogram" => Kind::Histogram,
            "summary" => Kind::Summary,
            "untyped" => Kind::Untyped,
            _ => return None,
        })
    }

    /// The suffixes its samples' names may add to the family's name.
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Kind::Counter => &["", "_total", "_created"],
            Kind::Histogram => &["_bucket", "_sum", "_count", "_created"],
            Kind::Summary => &["", "_sum", "_count", "_created"],
            Kind::Gauge | Kind::Untyped => &[""],
        }
    }
}

/// Every suffix a sample name can have beyond its family's name.
const SUFFIXES: [&str; 5] = ["_bucket", "_sum", "_count", "_total", "_created"];

/// Name prefixes that are llmslo's alone: an engine family under them is never taken.
pub const RESERVED_PREFIXES: [&str; 2] = ["llmslo_", "gen_ai_"];

/// One metric family: its samples, in the order the engine wrote them.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The family's name as `# TYPE` gave it (or the sample name of an untyped sample).
    pub name: String,
    /// Its type.
    pub kind: Kind,
    /// `# HELP`'s text, unescaped.
    pub help: Option<String>,
    /// Its samples.
    pub samples: Vec<Sample>,
}

impl Family {
    /// The full name of one of its samples.
    pub fn sample_name(&self, sample: &Sample) -> String {
        format!("{}{}", self.name, sample.suffix)
    }
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// What its name adds to its family's (`_bucket`, `_total`, … or nothing).
    pub suffix: &'static str,
    /// Its labels as `name="value",…`, values escaped as both text formats want them.
    pub labels: Box<str>,
    /// Its value.
    pub value: f64,
}

/// What a page's read left out, line by line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Lines that break the format's grammar (or repeat a series).
    pub malformed: u64,
    /// Samples of families left out for an impossible value (a negative or non-finite counter).
    pub invalid_value: u64,
    /// Samples of families named under llmslo's own prefixes.
    pub reserved_name: u64,
}

/// A page read: its families, and what was dropped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// The families, in the order they first appeared.
    pub families: Vec<Family>,
    /// What was left out.
    pub dropped: Dropped,
}

/// A page that could not be read at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// More samples or families than the cap allows: the page is refused whole.
    #[error("the page has more than {0} samples or families (engine_metrics_max_samples)")]
    TooLarge(usize),
    /// Not one line is the text format, and some are not: another page at that path.
    #[error("not the Prometheus text format: none of its {0} lines is")]
    NotText(u64),
}

impl Page {
    /// The family named `name`, if the page has one.
    pub fn family(&self, name: &str) -> Option<&Family> {
        self.families.iter().find(|f| f.name == name)
    }

    /// The values of every sample whose full name is `name`.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = f64> + 'a {
        self.families
            .iter()
            .filter(move |f| name.starts_with(f.name.as_str()))
            .flat_map(move |f| {
                let suffix = &name[f.name.len()..];
                f.samples.iter().filter(move |s| s.suffix == suffix).map(|s| s.value)
            })
    }
}

/// Reads a text-format page, keeping at most `max_samples` samples and as many families.
/// Samples belong to the family `# TYPE` named when their name is that family's with a suffix
/// its type allows; any other sample starts an untyped family of its own. A family met a
/// second time is merged into the first.
pub fn parse(text: &str, max_samples: usize) -> Result<Page, PageError> {
    let mut reader = Reader::new(max_samples);
    for line in text.lines() {
        reader.line(line.trim_end_matches('\r'))?;
    }
    if reader.samples == 0 && reader.families.is_empty() && reader.dropped.malformed > 0 {
        return Err(PageError::NotText(reader.dropped.malformed));
    }
    Ok(reader.finish())
}

/// The state of one page's read.
struct Reader {
    max: usize,
    families: Vec<Family>,
    /// Family index by name.
    index: HashMap<String, usize>,
    /// `# HELP` waiting for its `# TYPE`.
    help: Option<(String, String)>,
    /// Hashes of the series kept so far (keyed, so a page cannot aim at collisions).
    seen: HashSet<u64>,
    hasher: RandomState,
    /// Families with an impossible value, left out at the end.
    invalid: Vec<bool>,
    samples: usize,
    dropped: Dropped,
}

impl Reader {
    fn new(max: usize) -> Self {
        Self {
            max,
            families: Vec::new(),
            index: HashMap::new(),
            help: None,
            seen: HashSet::new(),
            hasher: RandomState::new(),
            invalid: Vec::new(),
            samples: 0,
            dropped: Dropped::default(),
        }
    }

    fn line(&mut self, line: &str) -> Result<(), PageError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        if let Some(comment) = line.strip_prefix('#') {
            return self.comment(comment);
        }
        match sample(line) {
            Some((name, labels, value)) => self.sample(name, labels, value),
            None => {
                self.dropped.malformed += 1;
                Ok(())
            }
        }
    }

    fn comment(&mut self, comment: &str) -> Result<(), PageError> {
        let mut words = comment.trim_start().splitn(3, [' ', '\t']);
        match (words.next(), words.next(), words.next()) {
            (Some("HELP"), Some(name), text) if is_metric_name(name) => match unescape_help(text.unwrap_or("")) {
                Some(text) => self.help = Some((name.to_string(), text)),
                None => self.dropped.malformed += 1,
            },
            (Some("TYPE"), Some(name), Some(kind)) if is_metric_name(name) => match Kind::parse(kind.trim()) {
                Some(kind) => return self.typed(name, kind),
                None => self.dropped.malformed += 1,
            },
            (Some("HELP" | "TYPE"), _, _) => self.dropped.malformed += 1,
            _ => {} // any other comment
        }
        Ok(())
    }

    fn typed(&mut self, name: &str, kind: Kind) -> Result<(), PageError> {
        let help = self.help.take().filter(|(of, _)| of == name).map(|(_, text)| text);
        match self.index.get(name) {
            Some(&at) if self.families[at].kind == kind => {}
            Some(_) => self.dropped.malformed += 1, // typed twice, differently
            None => {
                self.add_family(name, kind, help)?;
            }
        }
        Ok(())
    }

    fn add_family(&mut self, name: &str, kind: Kind, help: Option<String>) -> Result<usize, PageError> {
        if self.families.len() >= self.max {
            return Err(PageError::TooLarge(self.max));
        }
        self.families.push(Family {
            name: name.to_string(),
            kind,
            help,
            samples: Vec::new(),
        });
        self.invalid.push(false);
        let at = self.families.len() - 1;
        self.index.insert(name.to_string(), at);
        Ok(at)
    }

    /// The family a sample named `name` belongs to, and its suffix; `None` when its name is
    /// one a typed family owns but not with this suffix.
    fn owner(&mut self, name: &str) -> Result<Option<(usize, &'static str)>, PageError> {
        for suffix in std::iter::once("").chain(SUFFIXES) {
            let Some(base) = name.strip_suffix(suffix) else {
                continue;
            };
            if let Some(&at) = self.index.get(base) {
                if let Some(suffix) = self.families[at].kind.suffixes().iter().find(|s| **s == suffix) {
                    return Ok(Some((at, suffix)));
                }
                if suffix.is_empty() {
                    return Ok(None);
                }
            }
        }
        Ok(Some((self.add_family(name, Kind::Untyped, None)?, "")))
    }

    fn sample(&mut self, name: &str, labels: Labels, value: f64) -> Result<(), PageError> {
        let Some((at, suffix)) = self.owner(name)? else {
            self.dropped.malformed += 1;
            return Ok(());
        };
        let kind = self.families[at].kind;
        let bound = match (kind, suffix) {
            (Kind::Histogram, "_bucket") => Some("le"),
            (Kind::Summary, "") => Some("quantile"),
            _ => None,
        };
        if bound.is_some_and(|key| labels.bound(key).is_none()) {
            self.dropped.malformed += 1;
            return Ok(());
        }
        let series = self.hasher.hash_one((at, suffix, &labels.text));
        if !self.seen.insert(series) {
            self.dropped.malformed += 1; // the same series twice
            return Ok(());
        }
        if !possible(kind, suffix, value) {
            self.invalid[at] = true;
        }
        if self.samples >= self.max {
            return Err(PageError::TooLarge(self.max));
        }
        self.samples += 1;
        self.families[at].samples.push(Sample {
            suffix,
            labels: labels.text.into_boxed_str(),
            value,
        });
        Ok(())
    }

    fn finish(self) -> Page {
        let mut dropped = self.dropped;
        let families = self
            .families
            .into_iter()
            .zip(self.invalid)
            .filter_map(|(family, invalid)| {
                let count = family.samples.len() as u64;
                if invalid {
                    dropped.invalid_value += count;
                    None
                } else if RESERVED_PREFIXES.iter().any(|p| family.name.starts_with(p)) {
                    dropped.reserved_name += count;
                    None
                } else {
                    Some(family)
                }
            })
            .collect();
        Page { families, dropped }
    }
}

/// Whether `value` can be a sample of this kind and suffix: counts are never negative, NaN or
/// infinite.
fn possible(kind: Kind, suffix: &str, value: f64) -> bool {
    let count = value.is_finite() && value >= 0.0;
    match (kind, suffix) {
        (Kind::Counter, _) | (_, "_bucket" | "_count" | "_created") => count,
        _ => true,
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_' | b':'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'A'..=b'Z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A sample's label set, checked and written again.
struct Labels {
    /// `name="value",…` with each value's escapes as written (only `\\`, `\"` and `\n`).
    text: String,
}

impl Labels {
    /// A bucket's `le` or a summary's `quantile`, when present and a number.
    fn bound(&self, key: &str) -> Option<f64> {
        label_pairs(&self.text)
            .into_iter()
            .find(|(name, _)| name == key)
            .and_then(|(_, value)| parse_value(&value))
    }
}

/// `name{labels} value [timestamp]`, checked against the grammar; `None` when it is not one.
fn sample(line: &str) -> Option<(&str, Labels, f64)> {
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return None;
    }
    let rest = line[name_end..].trim_start_matches([' ', '\t']);
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => label_set(inner)?,
        None => (Labels { text: String::new() }, rest),
    };
    let mut words = rest.split([' ', '\t']).filter(|w| !w.is_empty());
    let value = parse_value(words.next()?)?;
    if let Some(timestamp) = words.next() {
        let digits = timestamp.strip_prefix('-').unwrap_or(timestamp);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    if words.next().is_some() {
        return None;
    }
    Some((name, labels, value))
}

/// The label set that `text` continues (after its `{`), and what follows its `}`.
fn label_set(mut text: &str) -> Option<(Labels, &str)> {
    let mut out = String::new();
    let mut names: Vec<&str> = Vec::new();
    loop {
        text = text.trim_start_matches([' ', '\t']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((Labels { text: out }, rest));
        }
        let eq = text.find('=')?;
        let name = text[..eq].trim_end_matches([' ', '\t']);
        if !is_label_name(name) || names.contains(&name) {
            return None;
        }
        names.push(name);
        let value = text[eq + 1..].trim_start_matches([' ', '\t']).strip_prefix('"')?;
        let end = quoted_end(value)?;
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "{name}=\"{}\"", &value[..end]);
        text = value[end + 1..].trim_start_matches([' ', '\t']);
        match text.as_bytes().first() {
            Some(b',') => text = &text[1..],
            Some(b'}') => {}
            _ => return None,
        }
    }
}

/// Where the quoted value `text` continues ends (its closing quote), when its only escapes are
/// `\\`, `\"` and `\n`.
fn quoted_end(text: &str) -> Option<usize> {
    let mut bytes = text.bytes().enumerate();
    while let Some((i, b)) = bytes.next() {
        match b {
            b'"' => return Some(i),
            b'\\' => match bytes.next() {
                Some((_, b'\\' | b'"' | b'n')) => {}
                _ => return None,
            },
            b'\n' => return None,
            _ => {}
        }
    }
    None
}

/// A sample value as the format writes it: a decimal number or `NaN`, `+Inf`, `-Inf`.
fn parse_value(word: &str) -> Option<f64> {
    match word {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        v if !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) =>
        {
            v.parse().ok()
        }
        _ => None,
    }
}

/// `# HELP` text with the format's escapes (`\\` and `\n`) undone; `None` for any other.
fn unescape_help(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
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

/// Every series name llmslo's own exposition holds or may hold, from its family names: an
/// engine family that would write any of them is left out of the merge.
#[derive(Debug, Default)]
pub struct OwnNames(HashSet<String>);

impl OwnNames {
    /// The names of families named `names`, with every suffix a sample of theirs may carry.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        const OWN_SUFFIXES: [&str; 9] = [
            "", "_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount",
        ];
        let mut taken = HashSet::new();
        for name in names {
            let base = name.strip_suffix("_total").unwrap_or(name);
            for suffix in OWN_SUFFIXES {
                taken.insert(format!("{name}{suffix}"));
                taken.insert(format!("{base}{suffix}"));
            }
        }
        Self(taken)
    }

    /// The family names an OpenMetrics exposition's `# TYPE` lines give.
    pub fn of_openmetrics(text: &str) -> Self {
        Self::new(
            text.lines()
                .filter_map(|line| line.strip_prefix("# TYPE "))
                .filter_map(|rest| rest.split(' ').next()),
        )
    }

    fn contains(&self, name: &str) -> bool {
        self.0.contains(name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
    }
}

/// The families of `page` that the merge writes, with their OpenMetrics names and types: none
/// without samples, none of the Python client's `*_created` gauges (OpenMetrics and protobuf
/// carry that time in the family), none with a series name `own` holds or an earlier family
/// wrote. Also returns how many samples were left out for a name taken.
pub fn mergeable<'a>(page: &'a Page, own: &OwnNames) -> (Vec<(&'a Family, String, &'static str)>, u64) {
    let typed = typed_names(&page.families);
    let mut written: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    let mut collided = 0;
    for family in &page.families {
        if family.samples.is_empty() || is_created_gauge(family, &typed) {
            continue;
        }
        let (name, kind) = openmetrics_name(family);
        let mut names: Vec<String> = family.samples.iter().map(|s| family.sample_name(s)).collect();
        names.sort_unstable();
        names.dedup();
        names.push(name.clone());
        names.push(family.name.clone());
        if names.iter().any(|n| own.contains(n) || written.contains(n)) {
            collided += family.samples.len() as u64;
            continue;
        }
        written.extend(names);
        out.push((family, name, kind));
    }
    (out, collided)
}

/// Writes the mergeable families of `page` as OpenMetrics families (without `# EOF`); returns
/// how many samples were left out for a name taken.
pub fn write_openmetrics(page: &Page, own: &OwnNames, out: &mut String) -> u64 {
    let (families, collided) = mergeable(page, own);
    for (family, name, kind) in families {
        if let Some(help) = &family.help {
            let escaped = help.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"");
            let _ = writeln!(out, "# HELP {name} {escaped}");
        }
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for sample in &family.samples {
            out.push_str(&family.name);
            out.push_str(sample.suffix);
            if !sample.labels.is_empty() {
                let _ = write!(out, "{{{}}}", sample.labels);
            }
            let _ = writeln!(out, " {}", openmetrics_value(sample.value));
        }
    }
    collided
}

/// The names a `*_created` gauge of the Python client may belong to: counters without
/// `_total`, histograms and summaries.
fn typed_names(families: &[Family]) -> HashSet<&str> {
    families
        .iter()
        .filter_map(|f| match f.kind {
            Kind::Counter => Some(f.name.strip_suffix("_total").unwrap_or(&f.name)),
            Kind::Histogram | Kind::Summary => Some(f.name.as_str()),
            _ => None,
        })
        .collect()
}

fn is_created_gauge(family: &Family, typed: &HashSet<&str>) -> bool {
    family.kind == Kind::Gauge
        && family
            .name
            .strip_suffix("_created")
            .is_some_and(|of| typed.contains(of))
}

/// A family's OpenMetrics name and type: a counter is named without `_total` (its samples
/// keep it); a counter whose samples lack it, and anything untyped, is `unknown`.
fn openmetrics_name(family: &Family) -> (String, &'static str) {
    match family.kind {
        Kind::Counter => match family.name.strip_suffix("_total") {
            Some(base) if family.samples.iter().all(|s| s.suffix.is_empty()) => (base.to_string(), "counter"),
            None if family.samples.iter().all(|s| s.suffix == "_total") => (family.name.clone(), "counter"),
            _ => (family.name.clone(), "unknown"),
        },
        Kind::Gauge => (family.name.clone(), "gauge"),
        Kind::Histogram => (family.name.clone(), "histogram"),
        Kind::Summary => (family.name.clone(), "summary"),
        Kind::Untyped => (family.name.clone(), "unknown"),
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

/// The label text of `labels` without the pair named `skip`: a histogram's or a summary's
/// series key.
pub fn without_label(labels: &str, skip: &str) -> String {
    let mut out = String::with_capacity(labels.len());
    for (name, value) in label_pairs(labels) {
        if name == skip {
            continue;
        }
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(
            out,
            "{name}=\"{}\"",
            value.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"")
        );
    }
    out
}

/// Keeps the first index of each distinct key, in order: how samples group into series.
pub fn group_by<T, K: std::hash::Hash + Eq>(items: impl IntoIterator<Item = (K, T)>) -> Vec<Vec<T>> {
    let mut at: HashMap<K, usize> = HashMap::new();
    let mut groups: Vec<Vec<T>> = Vec::new();
    for (key, item) in items {
        match at.entry(key) {
            Entry::Occupied(slot) => groups[*slot.get()].push(item),
            Entry::Vacant(slot) => {
                slot.insert(groups.len());
                groups.push(vec![item]);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests;
