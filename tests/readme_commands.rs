//! The `llmslo …` commands in the README's and docs' shell blocks run as written, so they
//! cannot drift from the code; and the README's config examples are valid.

use crate::common::llmslo_output;

/// File names the docs use as placeholders for the reader's own files.
const PLACEHOLDERS: [&str; 5] = ["my-slos.yaml", "manifests.yaml", "tls.crt", "tls.key", "IMG"];
/// Subcommands that run offline and finish at once.
const OFFLINE: [&str; 3] = ["rules", "check-config", "inject"];

fn documents() -> Vec<(String, String)> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/README.md")];
    for entry in std::fs::read_dir(format!("{root}/docs")).unwrap() {
        files.push(entry.unwrap().path().display().to_string());
    }
    files
        .into_iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap()))
        .collect()
}

/// The blocks fenced as `lang` in `text`, with backslash continuations joined.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}");
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == fence {
            let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            out.push(body.join("\n").replace("\\\n", " "));
        }
    }
    out
}

/// The arguments of each `llmslo …` command in a shell block: up to a pipe, a redirection,
/// a `;`, `&&` or a comment.
fn llmslo_commands(block: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    for line in block.lines() {
        for part in line.split("&&").flat_map(|p| p.split(';')) {
            let words: Vec<&str> = part.split_whitespace().collect();
            let Some(start) = words
                .iter()
                .position(|w| w.ends_with("llmslo") && !w.contains('/') || *w == "./target/release/llmslo")
            else {
                continue;
            };
            let args: Vec<String> = words[start + 1..]
                .iter()
                .take_while(|w| !["|", ">", "#", "2>&1", "&"].contains(w) && !w.starts_with('<'))
                .map(|w| w.to_string())
                .collect();
            commands.push(args);
        }
    }
    commands
}

#[test]
fn every_offline_llmslo_command_in_the_docs_runs() {
    let mut ran = 0;
    for (file, text) in documents() {
        for block in blocks(&text, "sh") {
            for args in llmslo_commands(&block) {
                let help = args.iter().any(|a| a == "--help" || a == "--version");
                let offline = args.first().is_some_and(|a| OFFLINE.contains(&a.as_str()));
                let placeholder = args.iter().any(|a| PLACEHOLDERS.contains(&a.as_str()));
                if !(help || offline) || placeholder || args.iter().any(|a| a.starts_with('[')) {
                    continue;
                }
                if args.first().map(String::as_str) == Some("inject") && !args.iter().any(|a| a == "-f") {
                    continue; // reads standard input from a pipe
                }
                let argv: Vec<&str> = args.iter().map(String::as_str).collect();
                let (code, _, stderr) = llmslo_output(&argv);
                assert_eq!(code, 0, "{file}: `llmslo {}` failed: {stderr}", args.join(" "));
                ran += 1;
            }
        }
    }
    assert!(ran >= 6, "only {ran} commands ran: the extraction is broken");
    eprintln!("ran {ran} llmslo commands from the README and docs");
}

#[test]
fn the_readme_config_examples_are_valid() {
    let readme = &documents()[0].1;
    let examples: Vec<String> = blocks(readme, "yaml")
        .into_iter()
        .filter(|b| b.contains("upstream:"))
        .collect();
    assert!(!examples.is_empty());
    for yaml in examples {
        if let Err(e) = llmslo::config::Config::from_yaml(&yaml) {
            panic!("README example does not validate: {e}\n{yaml}");
        }
    }
}

#[test]
fn every_llmslo_command_in_the_docs_parses() {
    use clap::{CommandFactory, Parser};
    let subcommands: Vec<String> = llmslo::cli::Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let mut parsed = 0;
    for (file, text) in documents() {
        for block in blocks(&text, "sh") {
            for args in llmslo_commands(&block) {
                // `helm install llmslo helm/llmslo …` names the release, not the binary.
                let runs_llmslo = args
                    .first()
                    .is_some_and(|a| a.starts_with('-') || subcommands.contains(a));
                if !runs_llmslo || args.iter().any(|a| a.contains('…') || a.starts_with('[')) {
                    continue;
                }
                let argv = std::iter::once("llmslo").chain(args.iter().map(String::as_str));
                if let Err(e) = llmslo::cli::Cli::try_parse_from(argv) {
                    use clap::error::ErrorKind;
                    if !matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                        panic!("{file}: `llmslo {}` does not parse: {e}", args.join(" "));
                    }
                }
                parsed += 1;
            }
        }
    }
    assert!(parsed >= 15, "only {parsed} commands parsed: the extraction is broken");
}

#[test]
fn the_docs_count_the_ignored_tests_right() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut needing_a_tool, mut long_proofs, mut other) = (0, 0, 0);
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().map(str::trim_start).filter(|l| l.starts_with("#[ignore")) {
                if line.starts_with("#[ignore = \"needs ") {
                    needing_a_tool += 1;
                } else if line.starts_with("#[ignore = \"long proof") {
                    long_proofs += 1;
                } else {
                    other += 1;
                }
            }
        }
    }
    assert_eq!(
        other, 0,
        "an ignored test says either what it needs or that it is a long proof"
    );
    let words = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen",
    ];
    for doc in ["README.md", "docs/development.md"] {
        let text = std::fs::read_to_string(root.join(doc))
            .unwrap()
            .replace('\n', " ")
            .to_lowercase();
        for said in [
            format!("the {} end-to-end tests", words[needing_a_tool]),
            format!("the {} long proofs", words[long_proofs]),
        ] {
            assert!(text.contains(&said), "{doc} should say \"{said}\"");
        }
    }
}

#[test]
fn the_docs_state_the_dashboards_schema_version_and_the_engine_version_deploy_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let mut versions = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(root.join("dashboards")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            versions.insert(dashboard["schemaVersion"].as_u64().unwrap());
        }
    }
    assert_eq!(versions.len(), 1, "one schemaVersion for every dashboard: {versions:?}");
    let schema = versions.first().unwrap();
    for doc in ["README.md", "docs/kubernetes.md"] {
        let text = read(doc);
        assert!(
            text.contains(&format!("schemaVersion {schema}")),
            "{doc} says schemaVersion {schema}"
        );
        assert!(
            text.contains("10, 11 and 12"),
            "{doc} names the Grafana versions that load it"
        );
    }
    // The README says which vLLM llmslo was checked against; deploy/ runs that one.
    let readme = read("README.md");
    let checked = readme
        .split("vLLM (checked against ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the README's compatibility row names the vLLM version");
    for manifest in ["deploy/vllm.yaml", "deploy/source/vllm.yaml"] {
        let text = read(manifest);
        let tags: Vec<&str> = text
            .split("vllm/vllm-openai:v")
            .skip(1)
            .map(|rest| rest.split_whitespace().next().unwrap())
            .collect();
        assert!(!tags.is_empty(), "{manifest} runs vLLM");
        for tag in tags {
            assert!(
                tag == checked || tag.starts_with(&format!("{checked}.")),
                "{manifest} runs vLLM {tag}, the README says checked against {checked}"
            );
        }
    }
}
