//! The sweep's own health during a step. A client whose process is starved (a busy host, a
//! noisy neighbour, too little CPU for its clients) reads every answer late: its latencies
//! grow with its own lag, not the engine's, and a knee it finds is its own. So each step
//! watches the client: how late its timers wake (a probe that asks to wake every
//! [`PROBE_PERIOD`]), how late open-loop requests left against their schedule, how much CPU
//! its process and the host used (the step itself sets the inter-chunk gaps beside the
//! engine's step).
//!
//! Lag only ever makes latencies look worse, so a step that met its SLOs met them; a step
//! that missed them while its client lagged more than [`lag_bound`] cannot say whose miss it
//! was, and the sweep names no knee at or above it.

use crate::quantile::nearest_rank;
use crate::slo::spec::{SloKind, SloSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often the probe asks to wake.
pub const PROBE_PERIOD: Duration = Duration::from_millis(5);

/// The share of the tightest deciding latency threshold the client may lag (p99) for a
/// missed step to count as the engine's.
pub const LAG_SHARE: f64 = 0.1;

/// The least lag bound: timers wake on millisecond ticks, and a lag of a few milliseconds
/// is the noise of any shared host.
pub const LAG_FLOOR: Duration = Duration::from_millis(10);

/// Clock ticks per second in /proc's CPU times (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// How the client fared during one step. NaN: not measured (no open-loop sends, or an OS
/// that does not say).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClientHealth {
    /// How late the probe woke, 99th percentile, seconds.
    pub wake_lag_p99_s: f64,
    /// Its latest wake, seconds.
    pub wake_lag_max_s: f64,
    /// How late open-loop requests left against their schedule, 99th percentile, seconds.
    pub send_lag_p99_s: f64,
    /// CPU the sweep's process used, in cores (1.0: one core busy the whole step).
    pub client_cpu_cores: f64,
    /// The host's CPU in use by anyone (steal apart), as a share of all its cores.
    pub host_busy: f64,
    /// The share of the host's CPU its hypervisor took (steal).
    pub host_steal: f64,
    /// The host's cores.
    pub cores: usize,
}

impl ClientHealth {
    /// The lag that decides: the later of the probe's and the sends' 99th percentiles.
    pub fn lag_p99_s(&self) -> f64 {
        self.wake_lag_p99_s.max(self.send_lag_p99_s)
    }

    /// Whether the client lagged more than `bound_s`.
    pub fn behind(&self, bound_s: f64) -> bool {
        self.lag_p99_s() > bound_s
    }

    /// The worst of several runs' figures (a comparison pools its repetitions).
    pub fn worst(runs: &[ClientHealth]) -> Option<ClientHealth> {
        let max = |f: fn(&ClientHealth) -> f64| runs.iter().map(f).fold(f64::NAN, f64::max);
        Some(ClientHealth {
            wake_lag_p99_s: max(|h| h.wake_lag_p99_s),
            wake_lag_max_s: max(|h| h.wake_lag_max_s),
            send_lag_p99_s: max(|h| h.send_lag_p99_s),
            client_cpu_cores: max(|h| h.client_cpu_cores),
            host_busy: max(|h| h.host_busy),
            host_steal: max(|h| h.host_steal),
            cores: runs.first()?.cores,
        })
    }

    /// What the client did, for people: its lag, its CPU and the host's.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!(
            "its timers woke {:.1} ms late (p99, latest {:.1} ms)",
            self.wake_lag_p99_s * 1e3,
            self.wake_lag_max_s * 1e3
        )];
        if self.send_lag_p99_s.is_finite() {
            parts.push(format!(
                "its requests left {:.1} ms after their time (p99)",
                self.send_lag_p99_s * 1e3
            ));
        }
        if self.client_cpu_cores.is_finite() {
            parts.push(format!(
                "its process used {:.2} of the host's {} cores",
                self.client_cpu_cores, self.cores
            ));
        }
        if self.host_busy.is_finite() {
            let steal = if self.host_steal > 0.005 {
                format!(", {:.0} % stolen by the hypervisor", self.host_steal * 100.0)
            } else {
                String::new()
            };
            parts.push(format!("the host was {:.0} % busy{steal}", self.host_busy * 100.0));
        }
        parts.join(", ")
    }
}

/// The lag a client may have for its misses to be the engine's: [`LAG_SHARE`] of the
/// tightest latency threshold that decides the knee, at least [`LAG_FLOOR`], seconds.
pub fn lag_bound(slos: &SloSet) -> f64 {
    let tightest = slos
        .slos
        .iter()
        .enumerate()
        .filter(|(i, _)| slos.decides_goodput(*i))
        .filter_map(|(_, slo)| match slo.kind {
            SloKind::Ttft(t) | SloKind::AnswerTtft(t) | SloKind::Tpot(t) | SloKind::E2e(t) => Some(t),
            SloKind::Availability => None,
        })
        .min();
    tightest
        .map_or(LAG_FLOOR, |t| t.mul_f64(LAG_SHARE).max(LAG_FLOOR))
        .as_secs_f64()
}

/// Watches the client through one step: started before its first request, finished after
/// its last.
pub struct Watch {
    probe: JoinHandle<()>,
    wake_lags: Arc<Mutex<Vec<f64>>>,
    send_lags: Arc<Mutex<Vec<f64>>>,
    started: std::time::Instant,
    own_cpu: Option<f64>,
    host: Option<HostTimes>,
}

impl Watch {
    /// Starts the probe on the current runtime and notes the CPU times.
    pub fn start() -> Self {
        let wake_lags = Arc::new(Mutex::new(Vec::new()));
        let lags = wake_lags.clone();
        let probe = tokio::spawn(async move {
            loop {
                let due = Instant::now() + PROBE_PERIOD;
                tokio::time::sleep_until(due).await;
                let late = Instant::now().saturating_duration_since(due).as_secs_f64();
                lags.lock().unwrap_or_else(PoisonError::into_inner).push(late);
            }
        });
        Self {
            probe,
            wake_lags,
            send_lags: Arc::new(Mutex::new(Vec::new())),
            started: std::time::Instant::now(),
            own_cpu: own_cpu_seconds(),
            host: HostTimes::read(),
        }
    }

    /// Where open-loop sends note how late they left.
    pub fn send_lags(&self) -> Arc<Mutex<Vec<f64>>> {
        self.send_lags.clone()
    }

    /// Stops the probe and returns the step's figures.
    pub fn finish(self) -> ClientHealth {
        self.probe.abort();
        let wall = self.started.elapsed().as_secs_f64();
        let sorted = |lags: &Mutex<Vec<f64>>| {
            let mut lags = std::mem::take(&mut *lags.lock().unwrap_or_else(PoisonError::into_inner));
            lags.sort_by(f64::total_cmp);
            lags
        };
        let wake = sorted(&self.wake_lags);
        let sends = sorted(&self.send_lags);
        // Under a paused clock (tests) a step takes no wall time: CPU shares are unknown.
        let timed = wall > 0.05;
        let client_cpu_cores = match (self.own_cpu, own_cpu_seconds()) {
            (Some(before), Some(after)) if timed => (after - before) / wall,
            _ => f64::NAN,
        };
        let (host_busy, host_steal) = match (self.host, HostTimes::read()) {
            (Some(before), Some(after)) if timed => after.since(before),
            _ => (f64::NAN, f64::NAN),
        };
        ClientHealth {
            wake_lag_p99_s: nearest_rank(&wake, 0.99),
            wake_lag_max_s: wake.last().copied().unwrap_or(f64::NAN),
            send_lag_p99_s: nearest_rank(&sends, 0.99),
            client_cpu_cores,
            host_busy,
            host_steal,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
        }
    }
}

/// The CPU seconds this process used so far (/proc/self/stat's `utime` and `stime`).
fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may hold spaces: state is 0, utime 11, stime 12.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / USER_HZ)
}

/// The host's CPU time so far, all cores together (/proc/stat's `cpu` line), in ticks.
#[derive(Debug, Clone, Copy, PartialEq)]
struct HostTimes {
    total: f64,
    idle: f64,
    steal: f64,
}

impl HostTimes {
    fn read() -> Option<Self> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` line: user nice system idle iowait irq softirq steal (guest time is in user).
    fn parse(stat: &str) -> Option<Self> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<f64> = line.split_whitespace().skip(1).map_while(|t| t.parse().ok()).collect();
        if ticks.len() < 8 {
            return None;
        }
        Some(Self {
            total: ticks[..8].iter().sum(),
            idle: ticks[3] + ticks[4],
            steal: ticks[7],
        })
    }

    /// The busy and stolen shares of the time between `before` and now.
    fn since(self, before: HostTimes) -> (f64, f64) {
        let total = self.total - before.total;
        if total <= 0.0 {
            return (f64::NAN, f64::NAN);
        }
        let idle = self.idle - before.idle;
        let steal = self.steal - before.steal;
        ((total - idle - steal) / total, steal / total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slos(yaml: &str) -> SloSet {
        let file = serde_yaml::from_str(yaml).unwrap();
        SloSet::validate(None, None, None, file).unwrap()
    }

    #[test]
    fn the_bound_is_a_tenth_of_the_tightest_deciding_threshold() {
        let set =
            slos("slos:\n  - {name: ttft, objective: 99, ttft: 800ms}\n  - {name: tpot, objective: 99, tpot: 100ms}\n");
        assert!((lag_bound(&set) - 0.010).abs() < 1e-12);
        let only_ttft = slos(
            "slos:\n  - {name: ttft, objective: 99, ttft: 800ms}\n  - {name: tpot, objective: 99, tpot: 100ms}\n\
             goodput:\n  require: [ttft]\n",
        );
        assert!((lag_bound(&only_ttft) - 0.080).abs() < 1e-12, "only the deciding SLOs");
        let tight = slos("slos:\n  - {name: tpot, objective: 99, tpot: 20ms}\n");
        assert_eq!(lag_bound(&tight), LAG_FLOOR.as_secs_f64());
    }

    #[test]
    fn host_times_read_busy_and_stolen_shares() {
        let before = HostTimes::parse("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let after = HostTimes::parse("cpu  400 0 200 800 100 0 0 300 0 0\n").unwrap();
        let (busy, steal) = after.since(before);
        assert!((busy - 0.5).abs() < 1e-12, "{busy}");
        assert!((steal - 0.375).abs() < 1e-12, "{steal}");
        assert_eq!(HostTimes::parse("cpu 1 2 3\n"), None, "too few fields");
    }

    #[test]
    fn this_process_reads_its_own_cpu_time() {
        let before = own_cpu_seconds().unwrap();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Busy until the CPU time moves (ticks are 10 ms); a reading stuck in place fails.
        while own_cpu_seconds().unwrap() <= before {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "5 s of work, no CPU time read"
            );
        }
        std::hint::black_box(x);
    }

    #[tokio::test(start_paused = true)]
    async fn under_a_paused_clock_the_probe_is_never_late() {
        let watch = Watch::start();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let health = watch.finish();
        assert_eq!(health.wake_lag_p99_s, 0.0);
        assert!(health.send_lag_p99_s.is_nan(), "no open-loop send");
        assert!(health.client_cpu_cores.is_nan(), "no wall time passed");
        assert!(!health.behind(0.005));
    }

    #[test]
    fn a_blocked_runtime_shows_as_lag() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let health = runtime.block_on(async {
            let watch = Watch::start();
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                // The runtime's only thread busy elsewhere: the probe cannot run.
                std::thread::sleep(Duration::from_millis(40));
            }
            watch.finish()
        });
        assert!(health.wake_lag_max_s >= 0.030, "{health:?}");
        assert!(health.behind(0.005), "{}", health.describe());
        assert!(health.describe().contains("timers woke"));
    }
}
