//! `llmslo bench`: the proxy's overhead, side by side in one run. The built-in
//! engine streams with fixed timing; clients stream through no proxy (the baseline), through
//! an `llmslo run` process with SLOs configured, and through nginx (`proxy_buffering off`)
//! when it is installed, and through a hop without measurement when one is given (the
//! `plain_hop` example: llmslo's own hop, which tells the hop's cost from the measurement's).
//! Per target and concurrency it reports client-side TTFT and
//! inter-chunk p99 and what the proxy added to them, the proxy's CPU seconds per 1000 output
//! tokens (and the part of them spent in user space) and its resident memory per concurrent
//! stream.

pub mod attacks;
mod client;
pub mod pd_attacks;
mod process;
pub mod soak;
pub mod tls;

use crate::tools::demo::EXAMPLE_SLOS;
use crate::tools::simulate::delay::Delay;
use crate::tools::simulate::{SimEngine, SimOptions};
use client::{run_streams, Samples};
use process::{nginx_config, Ports, Proxy};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tls::BenchTls;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrent streams, one measurement each.
    pub streams: Vec<usize>,
    /// Unrecorded streaming before each measurement (connections opened, pools filled).
    pub warmup: Duration,
    /// How long each measurement streams.
    pub duration: Duration,
    /// The built-in engine's fixed timing.
    pub engine: EngineTiming,
    /// The nginx binary, or `None` to leave nginx out.
    pub nginx: Option<PathBuf>,
    /// A hop to measure too, run as `PROGRAM UPSTREAM_URI LISTEN_ADDRESS`.
    pub hop: Option<PathBuf>,
    /// Worker threads (llmslo, the hop) or worker processes (nginx) each proxy runs.
    pub proxy_workers: usize,
    /// The first of the consecutive ports the engine and the proxies listen on, when chosen.
    pub first_port: Option<u16>,
    /// TLS on every hop: the clients to each proxy (and to the engine), each proxy to the engine.
    pub tls: bool,
}

/// The CPUs this process may use (a container's CPU limit included), at least one.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The built-in engine's fixed timing, for the bench and the soak.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct EngineTiming {
    /// Output tokens per request.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub tokens: u32,
    /// The engine's time to first token.
    #[arg(long, default_value = "50ms", value_parser = crate::flags::duration)]
    pub ttft: Duration,
    /// The engine's time per output token.
    #[arg(long, default_value = "10ms", value_parser = crate::flags::duration)]
    pub tpot: Duration,
}

/// One target at one concurrency.
#[derive(Debug, Clone)]
pub struct Row {
    /// Concurrent streams.
    pub streams: usize,
    /// `direct`, `llmslo`, `nginx` or `hop`.
    pub target: &'static str,
    /// What the clients saw.
    pub samples: Samples,
    /// Proxy CPU seconds per 1000 output tokens (none for `direct`).
    pub cpu_per_1k_tokens: Option<f64>,
    /// The part of that CPU time spent in user space, 0 to 1; the rest is the kernel's (none for
    /// `direct`).
    pub user_share: Option<f64>,
    /// Proxy resident memory added per concurrent stream, bytes (none for `direct`).
    pub rss_per_stream: Option<f64>,
}

/// Runs every measurement and returns the rows, baseline first at each concurrency.
pub async fn run(options: &BenchOptions) -> Result<Vec<Row>, String> {
    let ports = Ports::from(options.first_port);
    with_engine(
        "bench",
        options.engine,
        false,
        options.tls,
        &ports,
        |engine, dir, tls| measure(options, &ports, engine, dir, tls),
    )
    .await
}

/// Runs `work` against the built-in engine (following vLLM's `kv_transfer_params` with `pd`,
/// serving TLS with the certificate it is given with `tls`), with a scratch directory removed
/// afterwards.
async fn with_engine<T, F, Fut>(
    name: &str,
    timing: EngineTiming,
    pd: bool,
    tls: bool,
    ports: &Ports,
    work: F,
) -> Result<T, String>
where
    F: FnOnce(SocketAddr, PathBuf, Option<BenchTls>) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let dir = std::env::temp_dir().join(format!("llmslo-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tls = if tls { Some(BenchTls::make(&dir)?) } else { None };
    let server_tls = tls.as_ref().map(BenchTls::server).transpose()?;
    let shutdown = CancellationToken::new();
    let port = ports.take()?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("engine on 127.0.0.1:{port}: {e}"))?;
    let engine_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let engine = SimEngine::new(SimOptions {
        ttft: Delay::Fixed(timing.ttft),
        tpot: Delay::Fixed(timing.tpot),
        default_max_tokens: timing.tokens,
        pd: pd.then(|| crate::tools::simulate::disagg::PdOptions {
            prefill_per_token: Duration::from_micros(200),
            transfer_per_token: Duration::from_micros(20),
        }),
        ..SimOptions::default()
    });
    tokio::spawn(engine.serve_on(listener, server_tls, shutdown.clone()));
    let result = work(engine_addr, dir.clone(), tls).await;
    shutdown.cancel();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// An `llmslo run` process in front of `engine`, with SLOs and goodput configured so it does
/// all its usual work (serving `tls` and verifying the engine with its CA, when given);
/// returns it and its metrics address.
async fn start_sidecar_process(
    engine: SocketAddr,
    dir: &std::path::Path,
    extra_config: &str,
    worker_threads: Option<usize>,
    tls: Option<&BenchTls>,
    ports: &Ports,
) -> Result<(Proxy, SocketAddr), String> {
    let config = dir.join("llmslo.yaml");
    let tls_config = match tls {
        Some(t) => format!(
            "tls: {{cert_file: {}, key_file: {}}}\nupstream_tls: {{ca_file: {}}}\n",
            t.cert.display(),
            t.key.display(),
            t.ca.display()
        ),
        None => String::new(),
    };
    let sidecar_config =
        format!("engine: vllm\nservice: bench\n{EXAMPLE_SLOS}gpu: {{enabled: false}}\n{extra_config}{tls_config}");
    std::fs::write(&config, sidecar_config).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let llmslo_port = ports.take()?;
    let metrics_port = ports.take()?;
    let proxy = Proxy::start(
        "llmslo",
        exe.as_os_str(),
        &[
            "run".into(),
            "--config".into(),
            config.into_os_string(),
            "--upstream".into(),
            format!("{}://{engine}", if tls.is_some() { "https" } else { "http" }).into(),
            "--listen".into(),
            format!("127.0.0.1:{llmslo_port}").into(),
            "--metrics-listen".into(),
            format!("127.0.0.1:{metrics_port}").into(),
            "--log".into(),
            "warn".into(),
        ],
        llmslo_port,
        worker_threads,
    )
    .await?;
    Ok((proxy, SocketAddr::from(([127, 0, 0, 1], metrics_port))))
}

async fn measure(
    options: &BenchOptions,
    ports: &Ports,
    engine: SocketAddr,
    dir: PathBuf,
    tls: Option<BenchTls>,
) -> Result<Vec<Row>, String> {
    let tls = tls.as_ref();
    let roots = tls.map(|t| &t.roots);
    let dir = dir.as_path();
    let tokens = options.engine.tokens;
    let workers = options.proxy_workers;
    // The bench's load comes from one address, as through a gateway: every in-flight slot is its.
    let one_client = "max_in_flight_per_client: 1024\n";
    let mut proxies = vec![
        start_sidecar_process(engine, dir, one_client, Some(workers), tls, ports)
            .await?
            .0,
    ];
    if let Some(nginx) = &options.nginx {
        let port = ports.take()?;
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, nginx_config(engine, port, dir, workers, tls)).map_err(|e| e.to_string())?;
        proxies.push(
            Proxy::start(
                "nginx",
                nginx.as_os_str(),
                &["-p".into(), dir.into(), "-c".into(), conf.into_os_string()],
                port,
                None,
            )
            .await?,
        );
    }

    if let Some(hop) = &options.hop {
        let port = ports.take()?;
        let args = [format!("http://{engine}").into(), format!("127.0.0.1:{port}").into()];
        proxies.push(Proxy::start("hop", hop.as_os_str(), &args, port, Some(workers)).await?);
    }

    let mut rows = Vec::new();
    for &streams in &options.streams {
        let samples = run_streams(engine, None, roots, streams, options.warmup, options.duration, tokens).await;
        rows.push(Row {
            streams,
            target: "direct",
            samples,
            cpu_per_1k_tokens: None,
            user_share: None,
            rss_per_stream: None,
        });
        for proxy in &mut proxies {
            let idle_rss = proxy.anon_rss_bytes();
            let cpu_before = proxy.cpu_time();
            let (samples, peak_rss) = proxy
                .while_sampling_anon_rss(run_streams(
                    proxy.addr,
                    None,
                    roots,
                    streams,
                    options.warmup,
                    options.duration,
                    tokens,
                ))
                .await;
            let cpu = proxy.cpu_time().since(cpu_before);
            let tokens = (samples.output_tokens + samples.warmup_output_tokens) as f64;
            rows.push(Row {
                streams,
                target: proxy.name,
                cpu_per_1k_tokens: (tokens > 0.0).then(|| cpu.total() / tokens * 1000.0),
                user_share: (cpu.total() > 0.0).then(|| cpu.user / cpu.total()),
                rss_per_stream: Some(peak_rss.saturating_sub(idle_rss) as f64 / streams as f64),
                samples,
            });
        }
    }
    for proxy in proxies {
        proxy.stop();
    }
    Ok(rows)
}

/// The rows as a table, with each proxy's additions over the baseline at the same concurrency,
/// under a line naming how many workers each proxy had.
pub fn render(rows: &[Row], proxy_workers: usize, tls: bool) -> String {
    let mut out = String::new();
    if tls {
        let _ = writeln!(out, "TLS on every hop: client to proxy, proxy to engine, verified");
    }
    let (threads, processes) = match proxy_workers {
        1 => ("thread", "process"),
        _ => ("threads", "processes"),
    };
    let _ = writeln!(
        out,
        "each proxy serves with {proxy_workers} worker {threads} (nginx: worker {processes}; --proxy-workers)\n"
    );
    let _ = writeln!(
        out,
        "{:>7}  {:<7} {:>8} {:>6} {:>10} {:>10} {:>10} {:>10} {:>13} {:>5} {:>11}",
        "streams",
        "target",
        "requests",
        "failed",
        "TTFT p99",
        "+TTFT p99",
        "gap p99",
        "+gap p99",
        "CPU s/1k tok",
        "user",
        "RSS/stream"
    );
    let ms = |s: f64| format!("{:.2}ms", s * 1000.0);
    for row in rows {
        let base = rows
            .iter()
            .find(|r| r.streams == row.streams && r.target == "direct")
            .expect("the baseline comes first");
        let added = |value: f64, baseline: f64| {
            if row.target == "direct" {
                "-".to_string()
            } else {
                ms(value - baseline)
            }
        };
        let s = &row.samples;
        let _ = writeln!(
            out,
            "{:>7}  {:<7} {:>8} {:>6} {:>10} {:>10} {:>10} {:>10} {:>13} {:>5} {:>11}",
            row.streams,
            row.target,
            s.requests,
            s.failed,
            ms(s.ttft_p99()),
            added(s.ttft_p99(), base.samples.ttft_p99()),
            ms(s.gap_p99()),
            added(s.gap_p99(), base.samples.gap_p99()),
            row.cpu_per_1k_tokens.map_or("-".into(), |c| format!("{c:.4}")),
            row.user_share.map_or("-".into(), |u| format!("{:.0}%", u * 100.0)),
            row.rss_per_stream
                .map_or("-".into(), |b| format!("{:.1} KiB", b / 1024.0)),
        );
    }
    out
}
