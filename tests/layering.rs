//! The layers of the crate point one way: the command line uses the tools and the library,
//! never the other way round (the shared flag parsers and exit codes live in `flags`).

use std::path::{Path, PathBuf};

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

#[test]
fn nothing_below_the_cli_imports_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    for file in rust_files(&src) {
        let name = file.strip_prefix(&src).unwrap().display().to_string();
        if name == "cli.rs" || name == "main.rs" || name == "lib.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        if text.contains("crate::cli") {
            offenders.push(name);
        }
    }
    assert!(offenders.is_empty(), "these import the CLI: {offenders:?}");
}
