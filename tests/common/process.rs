//! The release or debug `llmslo` binary as its own process, for tests that measure what the
//! sidecar process holds (memory, file descriptors) apart from the test's own clients.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `llmslo run` in its own process, on loopback ports it reports.
pub struct SidecarProcess {
    child: Child,
    /// Where the proxy accepts requests.
    pub proxy: SocketAddr,
    /// Where `/metrics` and `/healthz` are served.
    pub metrics: SocketAddr,
    config: std::path::PathBuf,
}

impl SidecarProcess {
    /// Starts `llmslo run` in front of `upstream` with extra YAML lines; `max_fds` lowers the
    /// process's open-file limit (`ulimit -n`).
    pub fn start(upstream: SocketAddr, extra_yaml: &str, max_fds: Option<u32>) -> Self {
        let grace = if extra_yaml.contains("final_scrape_grace:") {
            ""
        } else {
            "final_scrape_grace: 0s\n"
        };
        let yaml = format!(
            "upstream: http://{upstream}\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\nengine: vllm\n\
             gpu:\n  enabled: false\n{grace}{extra_yaml}"
        );
        Self::with_file(&yaml, "", max_fds)
    }

    /// Starts `llmslo run --config FILE FLAGS` where FILE holds exactly `yaml`.
    pub fn with_file(yaml: &str, flags: &str, max_fds: Option<u32>) -> Self {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let config = std::env::temp_dir().join(format!("llmslo-process-{}-{n}.yaml", std::process::id()));
        std::fs::write(&config, yaml).unwrap();
        let limit = max_fds.map_or(String::new(), |n| format!("ulimit -n {n} && "));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("{limit}exec \"$0\" run --config \"$1\" {flags}"))
            .arg(env!("CARGO_BIN_EXE_llmslo"))
            .arg(&config)
            .env("LLMSLO_LOG_FORMAT", "json")
            .env("LLMSLO_LOG", "info")
            .env_remove("LLMSLO_UPSTREAM")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let started = loop {
            let line = lines.next().expect("llmslo exited before it started").unwrap();
            if line.contains("sidecar started") {
                break line;
            }
        };
        // Keep draining stderr so the process never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
        let field = |name: &str| -> SocketAddr {
            let value = started.split(&format!("\"{name}\":\"")).nth(1).unwrap();
            value.split('"').next().unwrap().parse().unwrap()
        };
        Self {
            proxy: field("proxy_addr"),
            metrics: field("metrics_addr"),
            child,
            config,
        }
    }

    fn status_field(&self, name: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// The process's resident memory, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.status_field("VmRSS:") * 1024
    }

    /// The process's peak resident memory so far, in bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        self.status_field("VmHWM:") * 1024
    }

    /// CPU time the process has used, user and system, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // The fields after the command name, which is in parentheses: utime and stime are the
        // 12th and 13th of them, in clock ticks of 1/100 s.
        let after = stat.rsplit_once(") ").unwrap().1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        ticks as f64 / 100.0
    }

    /// The status and size of a `/metrics` answer in the protobuf exposition.
    pub async fn get_protobuf(&self) -> (u16, usize) {
        use http_body_util::BodyExt;
        let request = http::Request::get(format!("http://{}/metrics", self.metrics))
            .header(
                "accept",
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
            )
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let response = super::client().request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body.len())
    }

    /// File descriptors the process has open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    /// The status `/healthz` answers within 2 s (0 when it does not answer).
    pub async fn healthz(&self) -> u16 {
        let request = b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
        let answer = super::raw_exchange(self.metrics, request, Duration::from_secs(2)).await;
        answer.get(9..12).and_then(|code| code.parse().ok()).unwrap_or(0)
    }

    /// The status and body `path` on the metrics port answers.
    pub async fn get(&self, path: &str) -> (u16, String) {
        use http_body_util::BodyExt;
        let uri = format!("http://{}{path}", self.metrics);
        let response = super::client().get(uri.parse().unwrap()).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Sends the process SIGHUP (read the config and the key tables again).
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Where the config file is.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config
    }

    /// `/metrics` as text.
    pub async fn scrape(&self) -> String {
        use http_body_util::BodyExt;
        let uri = format!("http://{}/metrics", self.metrics);
        let response = tokio::time::timeout(Duration::from_secs(5), super::client().get(uri.parse().unwrap()))
            .await
            .expect("/metrics answered within 5 s")
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// Stops the process with SIGTERM and requires a clean exit.
    pub fn stop(mut self) {
        super::terminate(&mut self.child);
    }
}

impl Drop for SidecarProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}
