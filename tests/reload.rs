//! Hot reload of the SLOs through the real binary: a changed file is picked up, a bad one is
//! refused with a logged error while the running SLOs stay, SIGHUP forces a re-read, and the
//! counters keep counting throughout.

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

fn config(slo: &str, objective: &str) -> String {
    format!(
        "upstream: http://127.0.0.1:1\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\nengine: vllm\nmodels: [m]\n\
         slos:\n  - {{name: {slo}, objective: {objective}, availability: true}}\n"
    )
}

/// Waits for a stderr line containing `needle`; returns it.
fn wait_for(lines: &Receiver<String>, needle: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(15))
            .unwrap_or_else(|_| panic!("no line with `{needle}`"));
        if line.contains(needle) {
            return line;
        }
    }
}

async fn metrics(addr: &str) -> String {
    let request = http::Request::get(format!("http://{addr}/metrics"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client().request(request).await.unwrap();
    String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slos_reload_on_change_and_sighup_and_bad_files_are_refused() {
    let path = std::env::temp_dir().join(format!("llmslo-reload-{}.yaml", std::process::id()));
    std::fs::write(&path, config("first", "99")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args(["run", "--config"])
        .arg(&path)
        .env("LLMSLO_LOG_FORMAT", "json")
        .env_remove("LLMSLO_UPSTREAM")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = wait_for(&lines, "sidecar started");
    let field = |name: &str| {
        started
            .split(&format!("\"{name}\":\""))
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .to_string()
    };
    let (proxy, metrics_addr) = (field("proxy_addr"), field("metrics_addr"));
    let proxy: std::net::SocketAddr = proxy.parse().unwrap();

    let send = || post_collect(proxy, "/v1/chat/completions", r#"{"model":"m","stream":true}"#.into());
    assert_eq!(
        send().await.0,
        502,
        "the engine is down: connect_error, bad for availability"
    );
    let text = metrics(&metrics_addr).await;
    assert!(
        text.contains("llmslo_slo_burn_rate{slo_service=\"llm\",slo=\"first\",model=\"m\",window=\"5m\"} NaN"),
        "{text}"
    );

    // A changed file: picked up within the poll interval.
    std::fs::write(&path, config("second", "99.5")).unwrap();
    wait_for(&lines, "config reloaded");
    let text = metrics(&metrics_addr).await;
    assert!(
        text.contains("llmslo_slo_error_budget_remaining_ratio{slo_service=\"llm\",slo=\"second\",model=\"m\"}"),
        "{text}"
    );
    assert!(
        !text.contains("llmslo_slo_burn_rate{slo_service=\"llm\",slo=\"first\""),
        "the old SLO's gauges are gone"
    );

    // A bad file: refused, logged, and the running SLOs stay.
    std::fs::write(&path, config("third", "250")).unwrap();
    let refused = wait_for(&lines, "config reload rejected");
    assert!(
        refused.contains("ERROR") && refused.contains("slos[0].objective"),
        "{refused}"
    );
    assert!(metrics(&metrics_addr).await.contains("slo=\"second\""));

    // SIGHUP re-reads even an unchanged file.
    assert!(Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    wait_for(&lines, "config reload rejected");

    // The counters kept counting across all of it.
    assert_eq!(send().await.0, 502);
    let text = metrics(&metrics_addr).await;
    assert_eq!(
        sample(&text, "llmslo_requests_total", &[("outcome", "connect_error")]),
        2.0
    );
    assert_eq!(sample(&text, "llmslo_slo_events_total", &[("slo", "first")]), 1.0);
    assert_eq!(sample(&text, "llmslo_slo_bad_events_total", &[("slo", "second")]), 1.0);

    terminate(&mut child);
    std::fs::remove_file(path).unwrap();
}
