//! The proxies under test as child processes: started, waited for, measured through /proc
//! (CPU time and resident memory, children included, as nginx's workers are), and stopped.

use super::tls::BenchTls;
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Clock ticks per second in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// CPU seconds a process and its children used, by where they ran.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTime {
    /// In user space: the proxy's own work.
    pub user: f64,
    /// In the kernel: system calls, the network stack, page faults.
    pub system: f64,
}

impl CpuTime {
    /// User and system together.
    pub fn total(self) -> f64 {
        self.user + self.system
    }

    /// What was used since `before`.
    pub fn since(self, before: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user - before.user,
            system: self.system - before.system,
        }
    }
}

/// A proxy process listening on 127.0.0.1.
#[derive(Debug)]
pub struct Proxy {
    /// What the rows call it.
    pub name: &'static str,
    /// Where clients connect.
    pub addr: SocketAddr,
    child: Child,
}

/// Where the bench's processes listen on 127.0.0.1: consecutive ports from a first one, or
/// free ones.
#[derive(Debug)]
pub struct Ports {
    /// The next port to hand out, when the user chose the first.
    next: Option<AtomicU32>,
}

impl Ports {
    /// Ports from `first` on, or free ones.
    pub fn from(first: Option<u16>) -> Self {
        Self {
            next: first.map(|p| AtomicU32::new(u32::from(p))),
        }
    }

    /// The next port.
    pub fn take(&self) -> Result<u16, String> {
        match &self.next {
            None => free_port(),
            Some(next) => {
                let port = next.fetch_add(1, Ordering::Relaxed);
                let port =
                    u16::try_from(port).map_err(|_| "--first-port: the ports after it run past 65535".to_string())?;
                // A process started on a taken port would fail where a client may still connect.
                std::net::TcpListener::bind(("127.0.0.1", port))
                    .map_err(|e| format!("127.0.0.1:{port} (from --first-port): {e}"))?;
                Ok(port)
            }
        }
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

impl Proxy {
    /// Starts `program` and waits until it accepts connections on `port`; `worker_threads`, when
    /// given, sizes an llmslo or tokio program's runtime through its environment (llmslo's
    /// variable too, which one inherited from the caller would otherwise override).
    pub async fn start(
        name: &'static str,
        program: &OsStr,
        args: &[OsString],
        port: u16,
        worker_threads: Option<usize>,
    ) -> Result<Self, String> {
        let mut command = Command::new(program);
        if let Some(threads) = worker_threads {
            command
                .env("LLMSLO_WORKER_THREADS", threads.to_string())
                .env("TOKIO_WORKER_THREADS", threads.to_string());
        }
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{name}: cannot start {}: {e}", program.to_string_lossy()))?;
        let mut proxy = Self {
            name,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(proxy.addr).await.is_ok() {
                return Ok(proxy);
            }
            if let Ok(Some(status)) = proxy.child.try_wait() {
                return Err(format!("{name} exited at start ({status})"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        proxy.stop();
        Err(format!("{name} did not listen on {port} within 10 s"))
    }

    /// The process and its children.
    fn pids(&self) -> Vec<u32> {
        let root = self.child.id();
        let mut pids = vec![root];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if stat_fields(pid).and_then(|f| f.get(1).and_then(|p| p.parse::<u32>().ok())) == Some(root) {
                pids.push(pid);
            }
        }
        pids
    }

    /// CPU time used so far, in user space and in the kernel.
    pub fn cpu_time(&self) -> CpuTime {
        cpu_time_of(self.pids())
    }

    /// Resident memory now, bytes.
    pub fn rss_bytes(&self) -> u64 {
        self.pids().into_iter().map(|pid| status_bytes(pid, "VmRSS:")).sum()
    }

    /// Resident anonymous memory now (heap and stacks), bytes: resident memory without the pages
    /// mapped from files, such as the program's own code, which are shared and paged in once, not
    /// per stream.
    pub fn anon_rss_bytes(&self) -> u64 {
        self.pids().into_iter().map(|pid| status_bytes(pid, "RssAnon:")).sum()
    }

    /// Open file descriptors of the process itself.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, |dir| dir.count())
    }

    /// Runs `work` while sampling resident anonymous memory every 50 ms; returns its output and
    /// the peak.
    pub async fn while_sampling_anon_rss<T>(&self, work: impl Future<Output = T>) -> (T, u64) {
        tokio::pin!(work);
        let mut peak = self.anon_rss_bytes();
        let mut ticker = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                output = &mut work => return (output, peak.max(self.anon_rss_bytes())),
                _ = ticker.tick() => peak = peak.max(self.anon_rss_bytes()),
            }
        }
    }

    /// Stops it (SIGTERM, so nginx takes its workers along) and reaps it.
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPU time `pids` used so far, together (/proc's `utime` and `stime`).
fn cpu_time_of(pids: Vec<u32>) -> CpuTime {
    let ticks = |f: &[String], i: usize| f[i].parse::<u64>().unwrap_or(0) as f64 / USER_HZ;
    pids.into_iter()
        .filter_map(stat_fields)
        .fold(CpuTime::default(), |sum, f| CpuTime {
            user: sum.user + ticks(&f, 11),
            system: sum.system + ticks(&f, 12),
        })
}

/// /proc/<pid>/stat after the command name: field 0 is the state, 1 the parent, 11 and 12
/// utime and stime.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A memory figure of /proc/<pid>/status (`field` with its colon, e.g. `VmRSS:`), bytes; 0 when
/// the process is gone.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// nginx as a streaming reverse proxy in front of `engine`: `workers` worker processes, no buffering, pooled
/// HTTP/1.1 upstream connections, every path under `dir`.
pub fn nginx_config(engine: SocketAddr, port: u16, dir: &Path, workers: usize, tls: Option<&BenchTls>) -> String {
    let (ssl, scheme, upstream_ssl) = match tls {
        None => (String::new(), "http", String::new()),
        Some(t) => (
            format!(
                " ssl;\n    ssl_certificate {};\n    ssl_certificate_key {}",
                t.cert.display(),
                t.key.display()
            ),
            "https",
            format!(
                "      proxy_ssl_trusted_certificate {};\n      proxy_ssl_verify on;\n      proxy_ssl_name localhost;\n\
                 \x20     proxy_ssl_session_reuse on;\n",
                t.ca.display()
            ),
        ),
    };
    let dir = dir.display();
    format!(
        "daemon off;\nworker_processes {workers};\npid {dir}/nginx.pid;\nerror_log {dir}/nginx-error.log warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {dir}/client_body;\n  proxy_temp_path {dir}/proxy;\n\
         \x20 fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
         \x20 upstream engine {{ server {engine}; keepalive 1024; }}\n\
         \x20 server {{\n    listen 127.0.0.1:{port}{ssl};\n    location / {{\n      proxy_pass {scheme}://engine;\n\
         {upstream_ssl}\x20     proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
         \x20   }}\n  }}\n}}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computing_counts_as_user_time() {
        // This thread's own times (/proc/<tid>/stat), untouched by the tests beside it.
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        let tid: u32 = link.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let own = || cpu_time_of(vec![tid]);
        let before = own();
        let start = std::time::Instant::now();
        let mut x = 1u64;
        while start.elapsed() < Duration::from_millis(400) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let used = own().since(before);
        assert!(used.user >= 0.1 && used.system < used.user, "{used:?}");
        assert!((used.total() - used.user - used.system).abs() < 1e-9);
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let own = std::process::id();
        let fields = stat_fields(own).unwrap();
        assert!(fields[11].parse::<u64>().is_ok() && fields[12].parse::<u64>().is_ok());
        let (rss, anon) = (status_bytes(own, "VmRSS:"), status_bytes(own, "RssAnon:"));
        assert!(rss > 1024 * 1024 && anon > 0 && anon < rss, "{anon} of {rss}");
    }

    #[test]
    fn nginx_config_streams_without_buffering() {
        let conf = nginx_config("127.0.0.1:9000".parse().unwrap(), 9100, Path::new("/tmp/b"), 2, None);
        assert!(conf.contains("proxy_buffering off;") && conf.contains("listen 127.0.0.1:9100;"));
        assert!(conf.contains("worker_processes 2;"));
        assert!(conf.contains("server 127.0.0.1:9000;") && conf.contains("pid /tmp/b/nginx.pid;"));
        assert!(!conf.contains("ssl") && conf.contains("proxy_pass http://engine;"));
    }

    #[test]
    fn with_tls_nginx_serves_and_verifies_on_both_sides() {
        let dir = std::env::temp_dir().join(format!("llmslo-bench-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tls = BenchTls::make(&dir).unwrap();
        let conf = nginx_config(
            "127.0.0.1:9000".parse().unwrap(),
            9100,
            Path::new("/tmp/b"),
            2,
            Some(&tls),
        );
        assert!(conf.contains("listen 127.0.0.1:9100 ssl;"), "{conf}");
        assert!(conf.contains(&format!("ssl_certificate {};", tls.cert.display())));
        assert!(conf.contains("proxy_pass https://engine;") && conf.contains("proxy_ssl_verify on;"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
