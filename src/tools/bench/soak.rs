//! `llmslo soak`: many concurrent streams through an `llmslo run` process for a long time,
//! sampling its resident memory, open file descriptors and `/metrics` scrape latency, to show
//! that nothing grows and everything is given back.

use super::attacks::Attack;
use super::client::run_streams;
use super::pd_attacks::{self, PdAttack, PdTargets};
use super::process::Ports;
use super::{start_sidecar_process, with_engine, EngineTiming};
use crate::tools::simulate::routing::RoutingSidecar;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// Concurrent streams.
    pub streams: usize,
    /// How long they stream.
    pub duration: Duration,
    /// Time between samples.
    pub sample_every: Duration,
    /// Samples before this are the warm-up, left out of the flatness check.
    pub settle: Duration,
    /// How long the fds may take to return once the load stops (the upstream pool closes idle
    /// engine connections after 90 s).
    pub fd_wait: Duration,
    /// The built-in engine's fixed timing.
    pub engine: EngineTiming,
    /// Interleave every attack of [`Attack::ALL`] with the streams, one after another.
    pub attacks: bool,
    /// Serve as an llm-d decode pod: the sidecar (role decode, relaying the prefill legs) in
    /// front of a routing sidecar with its SSRF protection on, the streams naming the engine as
    /// their prefill pod; with attacks, those of [`PdAttack::ALL`] too.
    pub disaggregated: bool,
}

impl SoakOptions {
    /// The memory limit the injector and the chart give the sidecar container of such a pod:
    /// with attacks, the soak passes only when RSS never reaches it.
    pub fn memory_limit(&self) -> u64 {
        if self.disaggregated {
            crate::k8s::inject::RELAY_MEMORY_LIMIT_BYTES
        } else {
            crate::k8s::inject::DEFAULT_MEMORY_LIMIT_BYTES
        }
    }
}

/// The sidecar's deadlines during a soak with attacks: shorter than the attacks' holds.
const ATTACK_DEADLINES: &str = "send_timeout: 4s\nconnection_idle_timeout: 4s\nrequest_body_timeout: 4s\n";

/// One sample of the sidecar process.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Time since the load started.
    pub at: Duration,
    /// Resident memory, bytes.
    pub rss: u64,
    /// Open file descriptors.
    pub fds: usize,
    /// How long one `/metrics` scrape took.
    pub scrape: Duration,
}

/// What the soak measured.
#[derive(Debug, Clone)]
pub struct SoakReport {
    /// The options it ran with.
    pub options: SoakOptions,
    /// Open fds before the load.
    pub baseline_fds: usize,
    /// Samples during the load.
    pub samples: Vec<Sample>,
    /// Open fds once the load ended (after the pool's idle connections closed).
    pub final_fds: usize,
    /// How long after the load the fds took to come back (or the wait, when they did not).
    pub fds_returned_after: Duration,
    /// Requests that finished and that failed.
    pub requests: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Those failures by what they were.
    pub failures: std::collections::BTreeMap<String, u64>,
    /// Rounds of every attack run during the load.
    pub attack_rounds: usize,
    /// `llmslo_client_timeouts_total` by deadline at the end: what the deadlines freed.
    pub client_timeouts: Vec<(String, f64)>,
    /// The largest RSS sampled during the load.
    pub peak_rss: u64,
    /// With disaggregated serving, the relay's and the legs' counters at the end
    /// (`llmslo_prefill_relay_skipped_total`, `llmslo_leg_fields_ignored_total`,
    /// `llmslo_ttft_part_seconds_count`), each series by its labels.
    pub pd_counts: Vec<(String, f64)>,
    /// Connections that reached the internal service the steering attack named (none, or the
    /// relay went where a client said).
    pub internal_reached: usize,
}

impl SoakReport {
    /// Samples after the warm-up.
    fn settled(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter().filter(|s| s.at >= self.options.settle)
    }

    /// Largest deviation of RSS from its mean after the warm-up, as a fraction of the mean.
    pub fn rss_deviation(&self) -> f64 {
        let rss: Vec<f64> = self.settled().map(|s| s.rss as f64).collect();
        if rss.is_empty() {
            return f64::NAN;
        }
        let mean = rss.iter().sum::<f64>() / rss.len() as f64;
        rss.iter().map(|r| (r - mean).abs() / mean).fold(0.0, f64::max)
    }

    /// The 99th percentile scrape latency (nearest rank).
    pub fn scrape_p99(&self) -> Duration {
        let mut scrapes: Vec<Duration> = self.samples.iter().map(|s| s.scrape).collect();
        scrapes.sort();
        let rank = ((scrapes.len() as f64) * 0.99).ceil() as usize;
        scrapes
            .get(rank.clamp(1, scrapes.len().max(1)) - 1)
            .copied()
            .unwrap_or_default()
    }

    /// The fds back to where they started and, without attacks, RSS within ±5% after the
    /// warm-up; with attacks, RSS under the memory limit and no legitimate request failed.
    pub fn passed(&self) -> bool {
        let fds = self.final_fds <= self.baseline_fds;
        if self.options.attacks {
            fds && self.peak_rss < self.options.memory_limit() && self.failed == 0 && self.internal_reached == 0
        } else {
            fds && self.rss_deviation() <= 0.05
        }
    }
}

/// Runs the soak: engine and sidecar started here, `streams` clients for `duration`.
pub async fn run(options: &SoakOptions) -> Result<SoakReport, String> {
    let ports = Ports::from(None);
    with_engine(
        "soak",
        options.engine,
        options.disaggregated,
        false,
        &ports,
        |engine, dir, _| soak(options, &ports, engine, dir),
    )
    .await
}

async fn soak(options: &SoakOptions, ports: &Ports, engine: SocketAddr, dir: PathBuf) -> Result<SoakReport, String> {
    // With attacks, the deadlines that free what a client holds are shorter than the attacks
    // that hold things, so that every one of them fires during the soak.
    let deadlines = if options.attacks { ATTACK_DEADLINES } else { "" };
    let shutdown = CancellationToken::new();
    let _stop_router = shutdown.clone().drop_guard();
    let (upstream, config, relay) = if options.disaggregated {
        let relay = SocketAddr::from(([127, 0, 0, 1], ports.take()?));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("routing sidecar: {e}"))?;
        let router = listener.local_addr().map_err(|e| e.to_string())?;
        tokio::spawn(RoutingSidecar::new(engine, Some(vec![relay])).serve(listener, None, shutdown.clone()));
        let config = format!("{deadlines}role: decode\nprefill_relay: {relay}\nprefill_pool: [{engine}]\n");
        (router, config, Some(relay))
    } else {
        (engine, deadlines.to_string(), None)
    };
    let (sidecar, metrics) = start_sidecar_process(upstream, &dir, &config, None, None, ports).await?;
    // The readiness probe's connection opens at start: take the baseline once it is there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline_fds = sidecar.open_fds();
    let (internal, reached) = pd_attacks::internal_service()
        .await
        .map_err(|e| format!("internal service: {e}"))?;
    let pd_targets = relay.map(|relay| PdTargets {
        proxy: sidecar.addr,
        relay,
        internal,
    });
    let load = tokio::spawn(run_streams(
        sidecar.addr,
        relay.map(|_| engine),
        None,
        options.streams,
        Duration::ZERO,
        options.duration,
        options.engine.tokens,
    ));
    let attacks = options
        .attacks
        .then(|| tokio::spawn(attack_until(sidecar.addr, pd_targets, options.duration)));
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut peak_rss = 0;
    let mut ticker = tokio::time::interval_at(started + options.sample_every, options.sample_every);
    while !load.is_finished() {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
        }
        if load.is_finished() {
            break;
        }
        let scrape = scrape(metrics).await?;
        let rss = sidecar.rss_bytes();
        peak_rss = peak_rss.max(rss);
        samples.push(Sample {
            at: started.elapsed(),
            rss,
            fds: sidecar.open_fds(),
            scrape,
        });
    }
    let load = load.await.map_err(|e| format!("the load failed: {e}"))?;
    let attack_rounds = match attacks {
        Some(attacks) => attacks.await.map_err(|e| format!("the attacks failed: {e}"))?,
        None => 0,
    };
    let ended = Instant::now();
    let mut final_fds = sidecar.open_fds();
    while final_fds > baseline_fds && ended.elapsed() < options.fd_wait {
        tokio::time::sleep(Duration::from_secs(1)).await;
        final_fds = sidecar.open_fds();
    }
    let fds_returned_after = ended.elapsed();
    let page = exposition(metrics).await?;
    let client_timeouts = series(&page, "llmslo_client_timeouts_total")
        .into_iter()
        .map(|(labels, count)| {
            (
                labels
                    .trim_start_matches("timeout=\"")
                    .trim_end_matches('"')
                    .to_string(),
                count,
            )
        })
        .collect();
    let pd_counts = match options.disaggregated {
        true => [
            "llmslo_prefill_relay_skipped_total",
            "llmslo_leg_fields_ignored_total",
            "llmslo_ttft_part_seconds_count",
        ]
        .iter()
        .flat_map(|family| {
            series(&page, family)
                .into_iter()
                .map(move |(labels, v)| (format!("{family}{{{labels}}}"), v))
        })
        .collect(),
        false => Vec::new(),
    };
    sidecar.stop();
    Ok(SoakReport {
        options: options.clone(),
        baseline_fds,
        samples,
        final_fds,
        fds_returned_after,
        requests: load.requests,
        failed: load.failed,
        failures: load.failures.clone(),
        attack_rounds,
        client_timeouts,
        peak_rss,
        pd_counts,
        internal_reached: reached.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// The whole answer to `GET /metrics`, its head included.
async fn exposition(metrics: SocketAddr) -> Result<String, String> {
    let mut stream = tokio::net::TcpStream::connect(metrics)
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// Each series of `family` in an exposition: its labels (as written between the braces) and
/// its value.
fn series(exposition: &str, family: &str) -> Vec<(String, f64)> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|rest| {
            let (labels, value) = rest.rsplit_once("} ")?;
            Some((labels.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Runs every attack in turn (those on disaggregated serving too, given their targets), a
/// second apart, until `duration` has passed; returns the rounds.
async fn attack_until(proxy: SocketAddr, pd: Option<PdTargets>, duration: Duration) -> usize {
    let until = Instant::now() + duration;
    let mut rounds = 0;
    loop {
        for attack in Attack::ALL {
            if Instant::now() >= until {
                return rounds;
            }
            attack.run(proxy).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for attack in pd.iter().flat_map(|targets| PdAttack::ALL.map(|a| (a, *targets))) {
            if Instant::now() >= until {
                return rounds;
            }
            attack.0.run(attack.1).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        rounds += 1;
    }
}

/// Times one complete `GET /metrics`.
async fn scrape(metrics: SocketAddr) -> Result<Duration, String> {
    let started = Instant::now();
    if !exposition(metrics).await?.starts_with("HTTP/1.1 200") {
        return Err("metrics: the scrape was not answered 200".into());
    }
    Ok(started.elapsed())
}

/// The samples and the verdicts as text.
pub fn render(report: &SoakReport) -> String {
    let mut out = String::new();
    let o = &report.options;
    let _ = writeln!(
        out,
        "{} streams{} for {}, sampled every {} (the first {} is warm-up)\n",
        o.streams,
        if o.disaggregated {
            " through the prefill relay and a routing sidecar"
        } else {
            ""
        },
        humantime::format_duration(o.duration),
        humantime::format_duration(o.sample_every),
        humantime::format_duration(o.settle)
    );
    let _ = writeln!(out, "{:>8} {:>10} {:>6} {:>10}", "at", "RSS", "fds", "scrape");
    for s in &report.samples {
        let _ = writeln!(
            out,
            "{:>7.0}s {:>7.1} MiB {:>6} {:>8.2}ms",
            s.at.as_secs_f64(),
            s.rss as f64 / (1 << 20) as f64,
            s.fds,
            s.scrape.as_secs_f64() * 1e3
        );
    }
    let verdict = |ok: bool| if ok { "yes" } else { "NO" };
    let deviation = report.rss_deviation();
    if o.attacks {
        let mut names = Attack::ALL.map(Attack::name).to_vec();
        if o.disaggregated {
            names.extend(PdAttack::ALL.map(PdAttack::name));
        }
        let _ = writeln!(
            out,
            "\nattacks: {} full rounds of: {}\npeak RSS under the {} MiB limit: {} ({:.1} MiB)",
            report.attack_rounds,
            names.join(", "),
            o.memory_limit() >> 20,
            verdict(report.peak_rss < o.memory_limit()),
            report.peak_rss as f64 / (1 << 20) as f64
        );
        if o.disaggregated {
            let _ = writeln!(
                out,
                "connections the relay made to the internal service: {} ({})",
                report.internal_reached,
                verdict(report.internal_reached == 0)
            );
            for (series, count) in &report.pd_counts {
                let _ = writeln!(out, "{series} {count}");
            }
        }
        let freed: Vec<String> = report
            .client_timeouts
            .iter()
            .map(|(timeout, count)| format!("{timeout} {count}"))
            .collect();
        let _ = writeln!(out, "clients cut off by their deadlines: {}", freed.join(", "));
    }
    let _ = writeln!(
        out,
        "\nrequests: {} finished, {} failed{}\n\
         RSS after warm-up within ±5% of its mean: {} (largest deviation {:.1}%)\n\
         fds back to the baseline: {} ({} before the load, {} after, {:.0} s after it ended)\n\
         scrape p99: {:.2}ms",
        report.requests,
        report.failed,
        if report.failures.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = report.failures.iter().map(|(what, n)| format!("{what}: {n}")).collect();
            format!(" ({})", each.join(", "))
        },
        verdict(deviation <= 0.05),
        deviation * 100.0,
        verdict(report.final_fds <= report.baseline_fds),
        report.baseline_fds,
        report.final_fds,
        report.fds_returned_after.as_secs_f64(),
        report.scrape_p99().as_secs_f64() * 1e3,
    );
    out
}
