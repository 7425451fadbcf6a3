//! A sweep watches its own health: the same sweep, once with its process starved (paused by
//! the test for most of every few tens of milliseconds, as a host with no CPU to spare would
//! leave it) and once not. Starved, its timers wake late, its TTFT misses are marked as the
//! client's and no knee is named; unstarved, nothing is marked.

use crate::common::{start_engine, timed_engine};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// TTFT within 50 ms for 80 % of requests: the engine answers in 20 ms, so only a client that
/// reads late can miss it.
const TTFT_50MS: &str = "slos:\n  - name: ttft-50ms\n    objective: 80\n    ttft: 50ms\n";

/// Runs the sweep binary against `engine`; with `starve`, pauses it 60 ms of every 75 ms
/// until it ends. Returns (exit code, the JSON document, standard error).
fn sweep(engine: std::net::SocketAddr, starve: bool) -> (i32, serde_json::Value, String) {
    let dir = std::env::temp_dir();
    let tag = format!("{}-{starve}", std::process::id());
    let config = dir.join(format!("llmslo-health-{tag}.yaml"));
    std::fs::write(&config, TTFT_50MS).unwrap();
    let json = dir.join(format!("llmslo-health-{tag}.json"));
    let child = Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args(["sweep", "--target", &format!("http://{engine}")])
        .args(["--config", config.to_str().unwrap(), "--concurrency", "1,2"])
        .args(["--warmup", "0.3s", "--duration", "2s", "--output-tokens", "8"])
        .args(["--json", json.to_str().unwrap()])
        .env("LLMSLO_WORKER_THREADS", "2")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let done = Arc::new(AtomicBool::new(false));
    let starver = starve.then(|| {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                // SAFETY: signals to our own child, which is reaped only after `done` is set.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(60));
                unsafe { libc::kill(pid, libc::SIGCONT) };
                std::thread::sleep(Duration::from_millis(15));
            }
        })
    });
    let output = {
        // Waiting reaps the child: the starver stops first, leaving it running.
        let mut child = child;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                break (status, child);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    done.store(true, Ordering::Release);
    if let Some(starver) = starver {
        starver.join().unwrap();
    }
    let (status, mut child) = output;
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let document = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    (status.code().unwrap_or(-1), document, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_client_is_named_as_the_limit_and_an_unstarved_one_is_not() {
    let (engine, stop) = start_engine(timed_engine(20, 2)).await;

    let (code, starved, stderr) = tokio::task::spawn_blocking(move || sweep(engine, true)).await.unwrap();
    assert_eq!(code, 0, "{stderr}");
    let steps = starved["steps"].as_array().unwrap();
    assert!(
        steps.iter().all(|s| s["client"]["behind"] == true),
        "every starved step is marked: {starved:#}"
    );
    assert!(steps
        .iter()
        .all(|s| s["client"]["wake_lag_p99_s"].as_f64().unwrap() > 0.03));
    assert_eq!(steps[0]["verdict"], "client_limited", "{starved:#}");
    assert_eq!(starved["knee"]["reached"], false);
    assert_eq!(starved["knee"]["client_limited"]["concurrency"], 1);
    assert!(
        stderr.contains("c=1: the client fell behind (its timers woke") && stderr.contains("not judged"),
        "{stderr}"
    );

    let (code, healthy, stderr) = tokio::task::spawn_blocking(move || sweep(engine, false)).await.unwrap();
    assert_eq!(code, 0, "{stderr}");
    let steps = healthy["steps"].as_array().unwrap();
    assert!(
        steps
            .iter()
            .all(|s| s["client"]["behind"] == false && s["verdict"] == "met"),
        "{healthy:#}"
    );
    assert!(healthy["knee"].get("client_limited").is_none());
    assert!(!stderr.contains("fell behind"), "{stderr}");
    stop.cancel();
}
