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

/// The `prometheus` binary, or `None` (after checking this is not CI, which must never skip).
pub fn binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join("prometheus"))
        .find(|path| path.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "`prometheus` is not installed: .ci/run installs it"
        );
        eprintln!("SKIPPED: `prometheus` is not on PATH (apt-get install prometheus)");
    }
    found
}

/// Starts `binary` in `dir` scraping `target` every second with `rules` loaded; `labels` are
/// added to the target the way Kubernetes discovery adds `namespace` and `pod`.
pub fn start(binary: &Path, dir: &Path, target: std::net::SocketAddr, rules: &str, labels: &str) -> Prometheus {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("rules.yaml"), rules).unwrap();
    std::fs::write(
        dir.join("prometheus.yaml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [rules.yaml]\n\
             scrape_configs:\n  - job_name: llmslo\n    static_configs: [{{targets: ['{target}'], labels: {{{labels}}}}}]\n"
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(binary)
        .arg(format!("--config.file={}", dir.join("prometheus.yaml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
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
