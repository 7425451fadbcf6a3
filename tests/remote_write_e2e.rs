//! End to end in a remote-write backend (Debian's VictoriaMetrics 1.79, which `.ci/run`
//! installs): three sidecars in front of simulated engines, labelled as pods of one service in
//! two namespaces; vmagent scrapes them and remote-writes to VictoriaMetrics; vmalert evaluates
//! exactly what `llmslo rules` prints, writes the recorded series back and sends its alerts to
//! a receiver of the test's own. The namespace whose engines fail pages, with its namespace and
//! service; the healthy one does not; and the fleet SLI is the ratio of the requests the test
//! saw fail.

use crate::common::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use llmslo::slo::rules::{self, RulesFormat};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child process killed (and reaped) when dropped, however the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(binary: &Path, args: &[String]) -> Running {
    Running(
        Command::new(binary)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The three VictoriaMetrics binaries, or `None` outside CI when they are not installed.
fn tools() -> Option<[PathBuf; 3]> {
    let install = ".ci/run installs it: apt-get install victoria-metrics";
    Some([
        required_tool("victoria-metrics", &[], install)?,
        required_tool("vmagent", &[], install)?,
        required_tool("vmalert", &[], install)?,
    ])
}

/// An Alertmanager stand-in: keeps every body POSTed to it.
async fn receiver() -> (SocketAddr, Arc<Mutex<Vec<serde_json::Value>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let kept = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        if let Ok(alerts) = serde_json::from_slice(&body) {
                            kept.lock().unwrap().push(alerts);
                        }
                        Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::new())))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (addr, received)
}

/// An instant query to VictoriaMetrics: the result vector (empty on any failure).
async fn query(port: u16, expr: &str) -> Vec<serde_json::Value> {
    let encoded: String = form_urlencoded::byte_serialize(expr.as_bytes()).collect();
    let request = http::Request::get(format!("http://127.0.0.1:{port}/api/v1/query?query={encoded}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let Ok(response) = client().request(request).await else {
        return Vec::new();
    };
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    answer["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(result: &serde_json::Value) -> f64 {
    result["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A sidecar with the availability SLO in front of an engine failing `error_rate` of requests;
/// the engine serves until its token is dropped.
async fn pod(
    error_rate: f64,
    config: &llmslo::config::Config,
) -> (llmslo::sidecar::Sidecar, tokio_util::sync::CancellationToken) {
    let (engine, stop) = start_engine(llmslo::tools::simulate::SimOptions {
        error_rate,
        ..timed_engine(1, 1)
    })
    .await;
    let mut config = config.clone();
    config.upstream = format!("http://{engine}").parse().unwrap();
    let sidecar = llmslo::sidecar::Sidecar::start(&config).await.unwrap();
    model_learned(&sidecar, "sim").await;
    (sidecar, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs victoria-metrics, vmagent and vmalert (apt-get install victoria-metrics); run with cargo test -- --include-ignored"]
async fn a_fleet_in_a_remote_write_backend_pages_the_burning_namespace_with_its_address() {
    let Some([victoria, vmagent, vmalert]) = tools() else {
        return;
    };
    let yaml = "upstream: http://127.0.0.1:1\nlisten: 127.0.0.1:0\nmetrics_listen: 127.0.0.1:0\nengine: vllm\n\
                service: chat\nmin_events: 5\nslos:\n  - {name: availability, objective: 99.9, availability: true}\n";
    let config = llmslo::config::Config::from_yaml(yaml).unwrap();
    // team-a: two pods whose engines fail 40 % of requests; team-b: one healthy pod.
    let mut engines = Vec::new();
    let mut pods = Vec::new();
    for (namespace, name, error_rate) in [("team-a", "a-1", 0.4), ("team-a", "a-2", 0.4), ("team-b", "b-1", 0.0)] {
        let (sidecar, engine) = pod(error_rate, &config).await;
        engines.push(engine);
        pods.push((namespace, name, sidecar));
    }

    let dir = std::env::temp_dir().join(format!("llmslo-remote-write-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (vm_port, alert_port) = (free_port(), free_port());
    let _victoria = spawn(
        &victoria,
        &[
            format!("-storageDataPath={}", dir.join("vm").display()),
            format!("-httpListenAddr=127.0.0.1:{vm_port}"),
            "-retentionPeriod=1d".into(),
            "-search.latencyOffset=1s".into(),
            "-search.disableCache".into(),
        ],
    );
    let targets: String = pods
        .iter()
        .map(|(namespace, pod, sidecar)| {
            format!(
                "      - targets: ['{}']\n        labels: {{namespace: {namespace}, pod: {pod}}}\n",
                sidecar.metrics_addr
            )
        })
        .collect();
    std::fs::write(
        dir.join("scrape.yaml"),
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: llmslo\n    static_configs:\n{targets}"
        ),
    )
    .unwrap();
    let _vmagent = spawn(
        &vmagent,
        &[
            format!("-promscrape.config={}", dir.join("scrape.yaml").display()),
            format!("-remoteWrite.url=http://127.0.0.1:{vm_port}/api/v1/write"),
            format!("-remoteWrite.tmpDataPath={}", dir.join("vmagent").display()),
            format!("-httpListenAddr=127.0.0.1:{}", free_port()),
            "-remoteWrite.flushInterval=1s".into(),
        ],
    );
    let (notifier, alerts) = receiver().await;
    let printed = rules::render(&config.slos, RulesFormat::Prometheus, rules::Scope::All);
    std::fs::write(dir.join("rules.yaml"), &printed).unwrap();
    let _vmalert = spawn(
        &vmalert,
        &[
            format!("-rule={}", dir.join("rules.yaml").display()),
            format!("-datasource.url=http://127.0.0.1:{vm_port}"),
            format!("-remoteWrite.url=http://127.0.0.1:{vm_port}"),
            format!("-notifier.url=http://{notifier}"),
            format!("-httpListenAddr=127.0.0.1:{alert_port}"),
            "-evaluationInterval=2s".into(),
        ],
    );

    // The counters are in the backend at zero before any request is sent, so that the 5-minute
    // window holds every request of the test.
    let deadline = Instant::now() + Duration::from_secs(60);
    while query(vm_port, "llmslo_slo_events_total{slo=\"availability\"}")
        .await
        .len()
        < 3
    {
        assert!(
            Instant::now() < deadline,
            "the sidecars' counters never reached VictoriaMetrics"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // 150 requests to each pod; the test counts what failed in each namespace.
    let mut sent = std::collections::BTreeMap::<&str, (u32, u32)>::new();
    for (namespace, _, sidecar) in &pods {
        for _ in 0..150 {
            let (status, _) = post_collect(sidecar.proxy_addr, "/v1/chat/completions", chat_body(2, true, true)).await;
            let counts = sent.entry(namespace).or_default();
            counts.0 += 1;
            counts.1 += u32::from(status >= 500);
        }
    }
    let (a_sent, a_failed) = sent["team-a"];
    let expected = f64::from(a_failed) / f64::from(a_sent);
    assert!(
        (0.25..0.55).contains(&expected),
        "team-a's engines fail 40 %: {a_failed} of {a_sent}"
    );
    assert_eq!(sent["team-b"].1, 0);

    // vmalert records the fleet SLI per namespace, and pages team-a alone.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut sli, mut paged) = (Vec::new(), Vec::new());
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        sli = query(
            vm_port,
            "slo:sli_error:ratio_rate5m{sloth_slo=\"availability\", model=\"sim\"}",
        )
        .await;
        let a = sli.iter().find(|r| r["metric"]["namespace"] == "team-a").map(value);
        paged = alerts
            .lock()
            .unwrap()
            .iter()
            .flat_map(|batch| batch.as_array().cloned().unwrap_or_default())
            .filter(|alert| alert["labels"]["alertname"] == "LLMSLOErrorBudgetBurnFast")
            .collect();
        if a.is_some_and(|a| (a - expected).abs() < 1e-9) && !paged.is_empty() {
            break;
        }
    }
    let ratio = |namespace: &str| sli.iter().find(|r| r["metric"]["namespace"] == namespace).map(value);
    assert!(
        ratio("team-a").is_some_and(|a| (a - expected).abs() < 1e-9),
        "the fleet SLI of team-a is {:?}, the requests say {expected} ({a_failed} of {a_sent}): {sli:#?}",
        ratio("team-a")
    );
    assert_eq!(ratio("team-b"), Some(0.0), "{sli:#?}");
    assert!(!paged.is_empty(), "no page reached the receiver");
    for alert in &paged {
        let labels = &alert["labels"];
        assert_eq!(labels["namespace"], "team-a", "{alert}");
        assert_eq!(labels["sloth_service"], "chat", "{alert}");
        assert_eq!(labels["model"], "sim", "{alert}");
        assert_eq!(labels["severity"], "page", "{alert}");
    }
    eprintln!(
        "fleet SLI team-a {:.4} = {a_failed}/{a_sent}; {} page notifications, all team-a",
        ratio("team-a").unwrap(),
        paged.len()
    );
    for (_, _, sidecar) in pods {
        sidecar.shutdown().await;
    }
    drop(engines);
    std::fs::remove_dir_all(dir).unwrap();
}
