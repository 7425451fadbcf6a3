//! A real Prometheus server for end-to-end tests: started on a free port with a scrape config
//! and rule file, queried over its HTTP API, killed when dropped.

use super::client;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running Prometheus; killed (by PID) when dropped, however the test ends.
pub struct Prometheus {
    child: Child,
    /// Its HTTP port on 127.0.0.1.
    pub port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `prometheus` binary, or `None` outside CI when it is not installed.
pub fn binary() -> Option<PathBuf> {
    super::required_tool("prometheus", &[], ".ci/run installs it: apt-get install prometheus")
}

/// Starts `binary` in `dir` scraping `target` every second with `rules` loaded; `labels` are
/// added to the target the way Kubernetes discovery adds `namespace` and `pod`.
pub fn start(binary: &Path, dir: &Path, target: std::net::SocketAddr, rules: &str, labels: &str) -> Prometheus {
    start_with_flags(binary, dir, target, rules, labels, &[])
}

/// [`start`] with extra command-line `flags` (feature flags).
pub fn start_with_flags(
    binary: &Path,
    dir: &Path,
    target: std::net::SocketAddr,
    rules: &str,
    labels: &str,
    flags: &[&str],
) -> Prometheus {
    start_scraping(binary, dir, &[(target, labels)], rules, flags)
}

/// Starts `binary` in `dir` scraping each of `targets` (with its own target labels) every
/// second, with `rules` loaded and extra command-line `flags`.
pub fn start_scraping(
    binary: &Path,
    dir: &Path,
    targets: &[(std::net::SocketAddr, &str)],
    rules: &str,
    flags: &[&str],
) -> Prometheus {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("rules.yaml"), rules).unwrap();
    let static_configs: Vec<String> = targets
        .iter()
        .map(|(target, labels)| format!("{{targets: ['{target}'], labels: {{{labels}}}}}"))
        .collect();
    std::fs::write(
        dir.join("prometheus.yaml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [rules.yaml]\n\
             scrape_configs:\n  - job_name: llmslo\n    static_configs: [{}]\n",
            static_configs.join(", ")
        ),
    )
    .unwrap();
    let port = super::free_port();
    let child = Command::new(binary)
        .arg(format!("--config.file={}", dir.join("prometheus.yaml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Prometheus { child, port }
}

impl Prometheus {
    /// GET `path` on the HTTP API; `Null` while the server is not up yet.
    pub async fn api(&self, path: &str) -> Value {
        let request = http::Request::get(format!("http://127.0.0.1:{}{path}", self.port))
            .body(Full::new(Bytes::new()))
            .unwrap();
        match client().request(request).await {
            Ok(response) => {
                serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap_or(Value::Null)
            }
            Err(_) => Value::Null,
        }
    }

    /// The whole answer to an instant query (`status`, `data` or `errorType`, `error`).
    pub async fn query_answer(&self, expr: &str) -> Value {
        let encoded: String = form_urlencoded::byte_serialize(expr.as_bytes()).collect();
        self.api(&format!("/api/v1/query?query={encoded}")).await
    }

    /// The result vector of an instant query (empty on any failure).
    pub async fn query(&self, expr: &str) -> Vec<Value> {
        let answer = self.query_answer(expr).await;
        answer["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

/// The simulated engine failing 30% of requests (so error panels and page alerts have
/// something to show) and a sidecar in front of it with the availability and TTFT SLOs, then
/// `extra_yaml`. Keep the token alive as long as the engine is needed.
pub async fn failing_engine_and_sidecar(
    tpot_ms: u64,
    extra_yaml: &str,
) -> (
    llmslo::sidecar::Sidecar,
    llmslo::config::Config,
    tokio_util::sync::CancellationToken,
) {
    let (engine, stop) = super::start_engine(llmslo::tools::simulate::SimOptions {
        error_rate: 0.3,
        per_request_metrics: true,
        ..super::timed_engine(tpot_ms + 1, tpot_ms)
    })
    .await;
    let yaml = format!(
        "upstream: http://{engine}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\nengine: vllm\nhealth_interval: 1s\n\
         service: chat\nmin_events: 5\nslos:\n  - {{name: availability, objective: 99.9, availability: true}}\n  \
         - {{name: ttft-500ms, objective: 99, ttft: 500ms}}\n{extra_yaml}"
    );
    let config = llmslo::config::Config::from_yaml(&yaml).unwrap();
    let sidecar = llmslo::sidecar::Sidecar::start(&config).await.unwrap();
    (sidecar, config, stop)
}

/// Eight clients sending `body` back to back until stopped.
pub struct Load {
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Starts the clients against `addr`.
    pub fn start(addr: std::net::SocketAddr, body: String) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let tasks = (0..8)
            .map(|_| {
                let (stop, body) = (stop.clone(), body.clone());
                tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        super::post_collect(addr, "/v1/chat/completions", body.clone()).await;
                    }
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops the clients and waits for them.
    pub async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}
