//! `llmslo bench`: a short run through a real `llmslo run` process (and nginx where it is
//! installed, which `.ci/run` does) gives one complete row per target and concurrency, and bad
//! flags are clear errors.

use std::process::Command;

fn bench(extra: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args([
            "bench",
            "--streams",
            "1,8",
            "--duration",
            "600ms",
            "--warmup",
            "200ms",
            "--tokens",
            "6",
            "--ttft",
            "5ms",
            "--tpot",
            "2ms",
        ])
        .args(extra)
        .env_remove("LLMSLO_LOG")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        output.status.code().unwrap(),
        text(&output.stdout),
        text(&output.stderr),
    )
}

/// The table's rows as (streams, target, requests, failed, CPU column, RSS column).
fn rows(table: &str) -> Vec<(u64, String, u64, u64, String, String)> {
    table
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("streams"))
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // The RSS column is "12.3 KiB" or "-".
            let rss_words = if f.last() == Some(&"KiB") { 2 } else { 1 };
            let rss = f[f.len() - rss_words..].join(" ");
            (
                f[0].parse().unwrap(),
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[f.len() - rss_words - 1].to_string(),
                rss,
            )
        })
        .collect()
}

fn nginx() -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|dir| dir.join("nginx"))
        .chain([std::path::PathBuf::from("/usr/sbin/nginx")])
        .find(|p| p.is_file())
        .map(|p| p.display().to_string());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "nginx is missing: .ci/run installs it"
        );
        eprintln!("SKIPPED: nginx is not installed (apt-get install nginx-light)");
    }
    found
}

#[test]
fn every_target_gets_a_complete_row_at_every_concurrency() {
    let Some(nginx) = nginx() else { return };
    let (code, out, err) = bench(&["--nginx", &nginx]);
    assert_eq!(code, 0, "{err}");
    let rows = rows(&out);
    let targets: Vec<(u64, &str)> = rows.iter().map(|r| (r.0, r.1.as_str())).collect();
    assert_eq!(
        targets,
        [
            (1, "direct"),
            (1, "llmslo"),
            (1, "nginx"),
            (8, "direct"),
            (8, "llmslo"),
            (8, "nginx")
        ],
        "{out}"
    );
    for (streams, target, requests, failed, cpu, rss) in &rows {
        assert!(*requests >= *streams, "{target} at {streams}: {out}");
        assert_eq!(*failed, 0, "{target} at {streams}: {out}");
        if target == "direct" {
            assert_eq!((cpu.as_str(), rss.as_str()), ("-", "-"));
        } else {
            assert!(cpu.parse::<f64>().unwrap() >= 0.0, "{out}");
            assert!(rss.ends_with("KiB"), "{out}");
        }
    }
}

#[test]
fn without_nginx_only_the_baseline_and_llmslo_run() {
    let (code, out, err) = bench(&["--without-nginx"]);
    assert_eq!(code, 0, "{err}");
    let targets: Vec<String> = rows(&out).into_iter().map(|r| r.1).collect();
    assert_eq!(targets, ["direct", "llmslo", "direct", "llmslo"], "{out}");
}

#[test]
fn bad_flags_are_clear_errors() {
    let (code, _, err) = bench(&["--nginx", "/nonexistent/nginx"]);
    assert_eq!(code, 64);
    assert!(err.contains("--nginx /nonexistent/nginx: no such file"), "{err}");
    for (flag, value) in [("--streams", "0"), ("--tokens", "1"), ("--duration", "soon")] {
        let output = Command::new(env!("CARGO_BIN_EXE_llmslo"))
            .args(["bench", flag, value])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(flag), "{flag} {value}");
    }
}
