//! The crate's modules stand on floors, and imports only run down: the command line over the
//! tools, over Kubernetes, over the sidecar's assembly, over the configuration, over the
//! servers, over the proxy, over the observer, over the readers of the request record, over
//! the record and the leaves. Within a floor, and within every module, no two parts import
//! each other, however indirectly. The floors are documented in docs/development.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, top first: a module may import from its own floor and the floors below.
const FLOORS: &[&[&str]] = &[
    &["main", "cli"],
    &["tools"],
    &["k8s"],
    &["sidecar"],
    &["config"],
    &["health", "serve"],
    &["proxy"],
    &["observe"],
    &[
        "metrics", "slo", "capacity", "cost", "otel", "engine", "gpu", "workload",
    ],
    &[
        "record",
        "body",
        "proto",
        "upstream",
        "provider",
        "quantile",
        "flags",
        "tenant",
        "fingerprint",
        "window",
        "own_wake",
    ],
];

/// A source file: its module path (`src/observe/stream.rs` is `observe::stream`, a `mod.rs`
/// is its directory's module, `lib.rs` the root) and its text.
struct Source {
    module: Vec<String>,
    text: String,
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn crate_sources() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources: Vec<Source> = rust_files(&src)
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(&src).unwrap().with_extension("");
            let mut module: Vec<String> = relative.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            Source {
                module,
                text: std::fs::read_to_string(&path).unwrap(),
            }
        })
        .collect();
    sources.sort_by(|a, b| a.module.cmp(&b.module));
    sources
}

/// `text` without comments, string literals and char literals (their contents are not code).
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        if rest.starts_with(&['/', '/']) {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i..].starts_with(&['/', '*']) {
                    depth += 1;
                    i += 2;
                } else if chars[i..].starts_with(&['*', '/']) {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if chars[i] == 'r' && matches!(rest.get(1), Some('"' | '#')) && !ident_char(chars.get(i.wrapping_sub(1)))
        {
            let hashes = rest[1..].iter().take_while(|c| **c == '#').count();
            if rest.get(1 + hashes) != Some(&'"') {
                out.push(chars[i]);
                i += 1;
                continue;
            }
            i += 2 + hashes;
            while i < chars.len() && !(chars[i] == '"' && chars[i + 1..].iter().take(hashes).all(|c| *c == '#')) {
                i += 1;
            }
            i += 1 + hashes;
            out.push_str("\"\"");
        } else if chars[i] == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if chars[i] == '\'' && (rest.get(2) == Some(&'\'') || rest.get(1) == Some(&'\\')) {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// The paths a use tree names (`a::{b, c::d}` is `a::b` and `a::c::d`).
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or("");
        return vec![path
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "*")
            .map(String::from)
            .collect()];
    };
    let prefix: Vec<String> = tree[..open]
        .split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (at, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(use_paths)
        .map(|tail| prefix.iter().cloned().chain(tail).collect())
        .collect()
}

/// Every path `code` names: its `use` trees, and `crate::…` and `super::…` paths in place.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(found) = code[at..].find("use ") {
        let start = at + found;
        at = start + 4;
        if start > 0 && ident_char(Some(&(bytes[start - 1] as char))) {
            continue;
        }
        if let Some(end) = code[at..].find(';') {
            paths.extend(use_paths(&code[at..at + end]));
        }
    }
    for prefix in ["crate::", "super::"] {
        let mut at = 0;
        while let Some(found) = code[at..].find(prefix) {
            let start = at + found;
            at = start + prefix.len();
            let before = code[..start].chars().next_back();
            if ident_char(before.as_ref()) || before == Some(':') {
                continue;
            }
            let path: String = code[start..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path: Vec<String> = path.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
            if path.len() > 1 {
                paths.push(path);
            }
        }
    }
    paths
}

/// The crate's module tree: every module path that has a file.
struct Tree(BTreeSet<Vec<String>>);

impl Tree {
    /// The module `path` (written in `module`) lands in: made absolute, then cut to the
    /// deepest module that exists. `None` for other crates' paths.
    fn resolve(&self, module: &[String], path: &[String]) -> Option<Vec<String>> {
        let mut here = module.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                here.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    here.pop();
                    rest = &rest[1..];
                }
            }
            // A child of this module, or another crate.
            Some(first) if !self.0.contains(&[module, &[first.to_string()]].concat()) => return None,
            Some(_) => {}
            None => return None,
        }
        for segment in rest {
            let deeper = [&here[..], std::slice::from_ref(segment)].concat();
            if !self.0.contains(&deeper) {
                break;
            }
            here = deeper;
        }
        Some(here)
    }
}

/// The imports between parts of the crate, each as (where, from, to): the two children of
/// the modules' nearest common ancestor `where` that hold the importer and the imported.
/// Imports between a module and its own ancestors or descendants are not among them.
fn imports(sources: &[Source]) -> BTreeSet<(Vec<String>, String, String)> {
    let tree = Tree(sources.iter().map(|s| s.module.clone()).collect());
    let mut edges = BTreeSet::new();
    for source in sources {
        for path in named_paths(&code_of(&source.text)) {
            let Some(target) = tree.resolve(&source.module, &path) else {
                continue;
            };
            let common = source.module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == source.module.len() || common == target.len() {
                continue;
            }
            edges.insert((
                source.module[..common].to_vec(),
                source.module[common].clone(),
                target[common].clone(),
            ));
        }
    }
    edges
}

/// The floor of a top-level module (0 is the top), if it has one.
fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&module))
}

/// What breaks the rule: imports up a floor, top-level modules without a floor, and import
/// cycles between the parts of any one module.
fn violations(sources: &[Source]) -> Vec<String> {
    let edges = imports(sources);
    let mut found = Vec::new();
    for source in sources {
        if let Some(top) = source.module.first().filter(|m| floor_of(m).is_none()) {
            found.push(format!(
                "`{top}` stands on no floor: add it to FLOORS and docs/development.md"
            ));
        }
    }
    for (parent, from, to) in &edges {
        if !parent.is_empty() {
            continue;
        }
        if let (Some(a), Some(b)) = (floor_of(from), floor_of(to)) {
            if a > b {
                found.push(format!("`{from}` imports `{to}`, a floor above it"));
            }
        }
    }
    let mut graphs: BTreeMap<&Vec<String>, BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for (parent, from, to) in &edges {
        graphs
            .entry(parent)
            .or_default()
            .entry(from.as_str())
            .or_default()
            .push(to.as_str());
    }
    for (parent, graph) in graphs {
        for cycle in cycles(&graph) {
            let place = if parent.is_empty() {
                "the crate".to_string()
            } else {
                format!("`{}`", parent.join("::"))
            };
            found.push(format!("in {place}, an import cycle: {}", cycle.join(" -> ")));
        }
    }
    found.sort();
    found.dedup();
    found
}

/// One cycle through each strongly connected part of `graph` that has one.
fn cycles<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    let mut found = Vec::new();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for &start in graph.keys() {
        if done.contains(start) {
            continue;
        }
        // Depth first from `start`, keeping the path: an edge back into it closes a cycle.
        let mut path: Vec<&str> = vec![start];
        let mut next: Vec<usize> = vec![0];
        while let Some(&node) = path.last() {
            let children = graph.get(node).map_or(&[][..], Vec::as_slice);
            let index = next.last_mut().unwrap();
            if let Some(&child) = children.get(*index) {
                *index += 1;
                if let Some(at) = path.iter().position(|n| *n == child) {
                    let mut cycle = path[at..].to_vec();
                    cycle.push(child);
                    found.push(cycle);
                } else if !done.contains(child) {
                    path.push(child);
                    next.push(0);
                }
            } else {
                done.insert(node);
                path.pop();
                next.pop();
            }
        }
    }
    found
}

#[test]
fn imports_run_down_the_floors_and_never_in_a_circle() {
    let sources = crate_sources();
    assert!(sources.len() > 100, "the whole crate was read");
    let edges = imports(&sources);
    assert!(
        edges.contains(&(vec![], "observe".into(), "record".into())),
        "the observer's imports of the record are seen"
    );
    let found = violations(&sources);
    assert!(found.is_empty(), "the layering is broken:\n{}", found.join("\n"));
}

/// A crate of `files` (path under `src/`, text), as the checks read one.
fn fake(files: &[(&str, &str)]) -> Vec<Source> {
    files
        .iter()
        .map(|(path, text)| {
            let mut module: Vec<String> = path.trim_end_matches(".rs").split('/').map(String::from).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            Source {
                module,
                text: text.to_string(),
            }
        })
        .collect()
}

#[test]
fn a_back_reference_an_unplaced_module_and_a_cycle_are_each_caught() {
    let sources = fake(&[
        (
            "lib.rs",
            "pub mod config; pub mod metrics; pub mod record; pub mod stray;",
        ),
        ("config/mod.rs", "use crate::metrics::Families;\npub struct Engine;"),
        // What `metrics` did before the record had its own floor.
        (
            "metrics/mod.rs",
            "mod a; mod b;\nuse crate::config::Engine; // a comment naming crate::tools is not code\n\
             pub struct Families;",
        ),
        (
            "metrics/a.rs",
            "use super::b::{B, self};\nlet s = \"crate::tools\";\npub struct A;",
        ),
        ("metrics/b.rs", "pub struct B(super::a::A);"),
        ("record/mod.rs", "pub struct RequestRecord;"),
        ("stray.rs", "use crate::record::{RequestRecord as R};"),
    ]);
    assert_eq!(
        violations(&sources),
        [
            "`metrics` imports `config`, a floor above it",
            "`stray` stands on no floor: add it to FLOORS and docs/development.md",
            "in `metrics`, an import cycle: a -> b -> a",
            "in the crate, an import cycle: config -> metrics -> config",
        ]
    );
}

#[test]
fn use_trees_and_paths_in_place_are_read_whole() {
    let code = code_of(
        "use crate::{a::{b, c::D}, e as f};\nuse super::g::*;\nfn x() { crate::h::i(); let c = '\"'; \
         let r = r#\"crate::no\"#; }\n/* crate::nor */",
    );
    let paths: Vec<String> = named_paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        paths,
        [
            "crate::a::b",
            "crate::a::c::D",
            "crate::e",
            "super::g",
            "crate::h::i",
            "super::g"
        ]
    );
}

#[test]
fn the_record_imports_nothing_of_the_crate() {
    let imported: Vec<_> = imports(&crate_sources())
        .into_iter()
        .filter(|(parent, from, _)| parent.is_empty() && from == "record")
        .collect();
    assert!(imported.is_empty(), "the record is the ground floor: {imported:?}");
}

#[test]
fn nothing_below_the_cli_imports_it() {
    let offenders: Vec<String> = crate_sources()
        .into_iter()
        .filter(|s| !s.module.is_empty() && s.module != ["main"] && s.module != ["cli"])
        .filter(|s| code_of(&s.text).contains("crate::cli"))
        .map(|s| s.module.join("::"))
        .collect();
    assert!(offenders.is_empty(), "these import the CLI: {offenders:?}");
}
