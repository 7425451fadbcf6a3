//! `llmslo bench`: a short run through a real `llmslo run` process (and nginx where it is
//! installed, which `.ci/run` does) gives one complete row per target and concurrency, and bad
//! flags are clear errors.

use crate::common::{llmslo_output, required_tool};

/// A fast built-in engine for short runs.
const ENGINE: [&str; 6] = ["--tokens", "6", "--ttft", "5ms", "--tpot", "2ms"];

fn bench(extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["bench", "--streams", "1,8", "--duration", "600ms", "--warmup", "200ms"];
    args.extend_from_slice(&ENGINE);
    args.extend_from_slice(extra);
    llmslo_output(&args)
}

/// The table's rows as (streams, target, requests, failed, CPU column, user column, RSS column).
fn rows(table: &str) -> Vec<(u64, String, u64, u64, String, String, String)> {
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
                f[f.len() - rss_words - 2].to_string(),
                f[f.len() - rss_words - 1].to_string(),
                rss,
            )
        })
        .collect()
}

fn nginx() -> Option<String> {
    // Debian's nginx is in /usr/sbin, often not on a user's PATH.
    required_tool(
        "nginx",
        &["/usr/sbin/nginx"],
        ".ci/run installs it: apt-get install nginx-light",
    )
    .map(|p| p.display().to_string())
}

#[test]
#[ignore = "needs nginx (apt-get install nginx-light); run with cargo test -- --include-ignored"]
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
    for (streams, target, requests, failed, cpu, user, rss) in &rows {
        assert!(*requests >= *streams, "{target} at {streams}: {out}");
        assert_eq!(*failed, 0, "{target} at {streams}: {out}");
        if target == "direct" {
            assert_eq!((cpu.as_str(), user.as_str(), rss.as_str()), ("-", "-", "-"));
        } else {
            let cpu: f64 = cpu.parse().unwrap();
            // 8 streams for 0.8 s are thousands of chunks: tens of ms, several /proc ticks.
            assert!(cpu > 0.0 || (*streams, target.as_str()) != (8, "llmslo"), "{out}");
            // The user-space share of that CPU time, when there was any to share.
            if cpu > 0.0 {
                let share: f64 = user.strip_suffix('%').expect("a percentage").parse().unwrap();
                assert!((0.0..=100.0).contains(&share), "{out}");
            }
            assert!(rss.ends_with("KiB"), "{out}");
        }
    }
}

#[test]
#[ignore = "needs nginx (apt-get install nginx-light); run with cargo test -- --include-ignored"]
fn with_tls_every_hop_of_every_target_is_tls_and_nothing_fails() {
    let Some(nginx) = nginx() else { return };
    let (code, out, err) = bench(&["--nginx", &nginx, "--tls"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("TLS on every hop"), "{out}");
    let rows = rows(&out);
    assert_eq!(rows.len(), 6, "{out}");
    for (streams, target, requests, failed, _, _, _) in &rows {
        assert!(*requests >= *streams, "{target} at {streams}: {out}");
        assert_eq!(*failed, 0, "{target} at {streams}: {out}");
    }
    assert!(
        llmslo_output(&["bench", "--tls", "--hop", "/bin/true"])
            .2
            .contains("--hop"),
        "a hop is measured on plain HTTP alone"
    );
}

#[test]
fn without_nginx_only_the_baseline_and_llmslo_run() {
    let (code, out, err) = bench(&["--without-nginx"]);
    assert_eq!(code, 0, "{err}");
    // By default each proxy has a worker per CPU, as nginx's `worker_processes auto`.
    let cpus = std::thread::available_parallelism().unwrap().get();
    let plural = if cpus == 1 { "" } else { "s" };
    assert!(
        out.starts_with(&format!("each proxy serves with {cpus} worker thread{plural} ")),
        "{out}"
    );
    let targets: Vec<String> = rows(&out).into_iter().map(|r| r.1).collect();
    assert_eq!(targets, ["direct", "llmslo", "direct", "llmslo"], "{out}");
}

#[test]
fn the_plain_hop_example_is_measured_beside_llmslo() {
    // `cargo test` builds the examples beside the binary.
    let hop = std::path::Path::new(env!("CARGO_BIN_EXE_llmslo"))
        .with_file_name("examples")
        .join("plain_hop");
    assert!(hop.is_file(), "{} is built by cargo test", hop.display());
    // The hop is started through a script that notes the worker counts it was given: llmslo's
    // variable, which a caller's own would otherwise override, and tokio's.
    let dir = std::env::temp_dir().join(format!("llmslo-bench-hop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (script, noted) = (dir.join("hop.sh"), dir.join("workers"));
    let text = format!(
        "#!/bin/sh\necho \"$LLMSLO_WORKER_THREADS $TOKIO_WORKER_THREADS\" > '{}'\nexec '{}' \"$@\"\n",
        noted.display(),
        hop.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, out, err) = bench(&[
        "--without-nginx",
        "--proxy-workers",
        "2",
        "--hop",
        script.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("each proxy serves with 2 worker threads"), "{out}");
    assert_eq!(std::fs::read_to_string(&noted).unwrap().trim(), "2 2");
    std::fs::remove_dir_all(&dir).unwrap();
    let rows = rows(&out);
    let targets: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(targets, ["direct", "llmslo", "hop", "direct", "llmslo", "hop"], "{out}");
    for (streams, target, requests, failed, _, _, rss) in rows.iter().filter(|r| r.1 == "hop") {
        assert!(*requests >= *streams && *failed == 0, "{target} at {streams}: {out}");
        assert!(rss.ends_with("KiB"), "{out}");
    }
}

#[test]
fn bad_flags_are_clear_errors() {
    let (code, _, err) = bench(&["--nginx", "/nonexistent/nginx"]);
    assert_eq!(code, 64);
    assert!(err.contains("--nginx /nonexistent/nginx: no such file"), "{err}");
    let (code, _, err) = bench(&["--without-nginx", "--hop", "/nonexistent/hop"]);
    assert_eq!(code, 64);
    assert!(err.contains("--hop /nonexistent/hop: no such file"), "{err}");
    for (flag, value) in [
        ("--streams", "0"),
        ("--tokens", "1"),
        ("--duration", "soon"),
        ("--proxy-workers", "0"),
    ] {
        let (code, _, err) = llmslo_output(&["bench", flag, value]);
        assert_eq!(code, 2, "{flag} {value}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

/// A first port whose next three are free too.
fn four_free_ports() -> u16 {
    loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first < 60_000 && (first..first + 4).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return first;
        }
    }
}

#[test]
fn the_ports_the_bench_listens_on_can_be_chosen() {
    let first = four_free_ports();
    // The engine takes the first port, llmslo the next: held here, llmslo cannot start there.
    let held = std::net::TcpListener::bind(("127.0.0.1", first + 1)).unwrap();
    let (code, _, err) = bench(&["--without-nginx", "--first-port", &first.to_string()]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains(&format!("127.0.0.1:{}", first + 1)), "{err}");
    drop(held);
    let (code, out, err) = bench(&["--without-nginx", "--first-port", &first.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rows(&out).len(), 4, "{out}");
    let (code, _, err) = bench(&["--without-nginx", "--first-port", "65535"]);
    assert_ne!(code, 0);
    assert!(err.contains("--first-port: the ports after it run past 65535"), "{err}");
}

#[test]
#[ignore = "long proof (40 s: it waits for the pooled connections to close): CI runs it with --include-ignored"]
fn a_short_soak_samples_memory_fds_and_scrapes_and_gives_its_fds_back() {
    // The pooled engine connections close after 90 s idle: the wait covers that.
    let mut args = vec!["soak", "--streams", "8", "--duration", "4s", "--sample-every", "1s"];
    args.extend_from_slice(&["--settle", "1s", "--fd-wait", "100s"]);
    args.extend_from_slice(&ENGINE);
    let (code, stdout, stderr) = llmslo_output(&args);
    let samples: Vec<(f64, usize)> = stdout
        .lines()
        .filter(|l| l.contains("MiB"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect();
    assert!(samples.len() >= 3, "a sample a second:\n{stdout}\n{stderr}");
    assert!(samples.iter().all(|&(rss, fds)| rss > 1.0 && fds > 8), "{stdout}");
    assert!(stdout.contains("0 failed"), "{stdout}");
    assert!(stdout.contains("fds back to the baseline: yes"), "{stdout}");
    assert!(stdout.contains("scrape p99: "), "{stdout}");
    // The exit status is the verdict: 0 only when the memory was flat too.
    assert_eq!(code == 0, stdout.contains("within ±5% of its mean: yes"), "{stdout}");
    let (code, _, stderr) = llmslo_output(&["soak", "--sample-every", "0s"]);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("--sample-every"), "{stderr}");
}
