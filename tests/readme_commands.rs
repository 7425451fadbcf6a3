//! The `llmslo …` commands in the README's and docs' shell blocks run as written, so they
//! cannot drift from the code; and the README's config examples are valid.

mod common;

use common::llmslo_output;

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
fn the_readme_counts_the_ignored_tests_right() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ignored = 0;
    for entry in std::fs::read_dir(root.join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            ignored += text.lines().filter(|l| l.trim_start().starts_with("#[ignore")).count();
        }
    }
    let words = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    ];
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let said = format!("the {} end-to-end tests", words[ignored]);
    assert!(
        readme.contains(&said),
        "the README should say \"{said}\": {ignored} tests are #[ignore]d"
    );
}
