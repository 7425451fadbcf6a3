//! What clients send cannot grow the exported series or memory, and never reaches the logs.

use crate::common::*;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

fn series_lines(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#')).count()
}

fn model_values(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.split("model=\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_string)
        .collect()
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
}

async fn send_random_models(addr: std::net::SocketAddr, count: usize, seed: usize) {
    let mut tasks = Vec::new();
    for worker in 0..16 {
        tasks.push(tokio::spawn(async move {
            for i in (worker..count).step_by(16) {
                let model = format!("model-{:x}-{i}", seed.wrapping_mul(0x9E37_79B9) ^ i);
                let body = serde_json::json!({"model": model, "stream": true, "max_tokens": 2}).to_string();
                let (status, _) = post_collect(addr, "/v1/chat/completions", body).await;
                assert_eq!(status, 404, "the engine does not serve {model}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_model_names_leave_series_and_memory_flat() {
    let (engine, _stop) = start_engine(timed_engine(1, 1)).await;
    let sidecar = start_sidecar(engine, "max_models: 4\n").await;
    send_random_models(sidecar.proxy_addr, 1_000, 1).await;
    let after_1k = sidecar.metrics.encode();
    let rss_1k = rss_bytes();
    send_random_models(sidecar.proxy_addr, 9_000, 2).await;
    let after_10k = sidecar.metrics.encode();
    let rss_10k = rss_bytes();

    let models = model_values(&after_10k);
    assert!(models.len() <= 4 + 1, "at most max_models plus `other`: {models:?}");
    assert!(models.contains("other"));
    assert_eq!(
        series_lines(&after_1k),
        series_lines(&after_10k),
        "no new series after the first thousand"
    );
    assert!(after_10k.len() <= after_1k.len() + 256, "only the counts grew");
    assert_eq!(
        sample(&after_10k, "llmslo_requests_total", &[("outcome", "client_error")]),
        10_000.0
    );
    let growth = rss_10k.saturating_sub(rss_1k);
    eprintln!(
        "series after 1k and 10k requests: {} and {}; RSS {} KiB then {} KiB",
        series_lines(&after_1k),
        series_lines(&after_10k),
        rss_1k / 1024,
        rss_10k / 1024
    );
    assert!(growth < 16 << 20, "RSS grew {growth} bytes over 9000 requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_completions_and_credentials_never_reach_the_logs() {
    const PROMPT_SECRET: &str = "prompt-secret-7f3a9c";
    const COMPLETION_SECRET: &str = "completion-secret-42b1";
    const KEY_SECRET: &str = "sk-auth-91b2e6";
    const MODEL_SECRET: &str = "prompt-pasted-into-model-5d0e";
    let stream = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{COMPLETION_SECRET}\"}}}}]}}\n\n\
         data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":1}}}}\n\ndata: [DONE]\n\n"
    );
    let (upstream, _) = scripted_upstream(Script::sse(vec![(Duration::ZERO, stream.into_bytes())])).await;
    // The key is also a tenant's, through the key table: matching it logs nothing of it.
    let dir = std::env::temp_dir().join(format!("llmslo-hygiene-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("keys.yaml"), format!("team-k: [{KEY_SECRET}]\n")).unwrap();
    let config = dir.join("llmslo.yaml");
    std::fs::write(
        &config,
        format!(
            "tenants:\n  from: [{{api_keys: {}}}]\n",
            dir.join("keys.yaml").display()
        ),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_llmslo"))
        .args(["run", "--upstream", &format!("http://{upstream}")])
        .args(["--config", config.to_str().unwrap()])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--log",
            "trace",
        ])
        .env("LLMSLO_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut log = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            log.extend_from_slice(&buf[..n]);
            // Only the new bytes: the whole log each time would hold its square in memory,
            // in the process whose memory the test beside this one measures.
            let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        String::from_utf8_lossy(&log).into_owned()
    });
    let mut start = String::new();
    let proxy = loop {
        start.push_str(&rx.recv_timeout(Duration::from_secs(20)).expect("no start-up line"));
        if let Some(rest) = start.split("\"proxy_addr\":\"").nth(1) {
            break rest.split('"').next().unwrap().parse::<std::net::SocketAddr>().unwrap();
        }
    };

    let body = serde_json::json!({
        "model": "m", "stream": true,
        "messages": [{"role": "user", "content": format!("please keep {PROMPT_SECRET} safe")}],
    });
    // Once over HTTP/1.1 and once over h2c (whose library traces frames).
    for client in [client(), h2c_client()] {
        let request = http::Request::post(format!("http://{proxy}/v1/chat/completions"))
            .header("authorization", format!("Bearer {KEY_SECRET}"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let received = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert!(
            String::from_utf8_lossy(&received).contains(COMPLETION_SECRET),
            "the client got the completion"
        );
    }

    // A prompt pasted into `model`, 200 000 bytes of it: the log names the normalised label.
    let huge_model = format!("{MODEL_SECRET} {}", "y".repeat(200_000));
    let body = serde_json::json!({"model": huge_model, "stream": true, "messages": []});
    let (status, _) = post_collect(proxy, "/v1/chat/completions", body.to_string()).await;
    assert_eq!(status, 200);

    tokio::time::sleep(Duration::from_millis(300)).await;
    terminate(&mut child);
    let log = reader.join().unwrap();
    assert!(
        log.contains("request finished"),
        "the request was logged at all:\n{log}"
    );
    assert!(
        log.contains("\"token_count_source\":\"usage\""),
        "the count source is logged:\n{log}"
    );
    // One line per request, with plain values.
    let per_request: Vec<&str> = log.lines().filter(|l| l.contains("\"model\"")).collect();
    assert_eq!(per_request.len(), 3, "{per_request:#?}");
    assert!(
        per_request.iter().all(|l| l.contains("request finished")),
        "{per_request:#?}"
    );
    let ours: Vec<&str> = log.lines().filter(|l| l.contains("\"target\":\"llmslo")).collect();
    assert!(ours.iter().all(|l| !l.contains("Some(")), "{ours:#?}");
    for secret in [PROMPT_SECRET, COMPLETION_SECRET, KEY_SECRET, MODEL_SECRET] {
        assert!(!log.contains(secret), "`{secret}` leaked into the log");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(
        longest < 4096,
        "a {longest}-byte log line: client strings must be bounded"
    );
}
