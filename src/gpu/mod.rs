//! GPU telemetry: a background task samples the devices through a
//! [`DeviceSource`] (NVML in production) on a blocking thread and publishes one snapshot; a
//! collector encodes that snapshot at scrape time and never touches NVML itself.

pub mod nvml;
pub mod simulated;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// GPU sampling settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSettings {
    /// `gpu.enabled`: `false` turns GPU telemetry off entirely.
    pub enabled: bool,
    /// `gpu.interval`: time between samples.
    pub interval: Duration,
    /// `gpu.library_path`: the NVML library to load.
    pub library_path: String,
    /// `gpu.processes`: export per-process GPU memory.
    pub processes: bool,
    /// `gpu.simulated`: export one simulated GPU instead of reading NVML (demos, dashboards).
    pub simulated: bool,
}

impl Default for GpuSettings {
    /// On, a sample a second, NVML from the usual library, no per-process memory.
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(1),
            library_path: nvml::DEFAULT_LIBRARY.to_string(),
            processes: false,
            simulated: false,
        }
    }
}

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Largest number of processes exported per GPU (the ones using the most memory).
const MAX_PROCESSES: usize = 16;
/// The same kind of failure is warned about at most this often.
const WARN_EVERY: Duration = Duration::from_secs(3600);

/// Why a reading failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The device or driver does not offer this reading.
    #[error("not supported")]
    NotSupported,
    /// The device fell off the bus or otherwise went away.
    #[error("GPU lost")]
    GpuLost,
    /// The process may not read this.
    #[error("no permission")]
    NoPermission,
    /// Anything else, including a missing library or driver.
    #[error("{0}")]
    Other(String),
}

impl GpuError {
    fn kind(&self) -> &'static str {
        match self {
            GpuError::NotSupported => "not_supported",
            GpuError::GpuLost => "gpu_lost",
            GpuError::NoPermission => "no_permission",
            GpuError::Other(_) => "other",
        }
    }
}

/// One reading that may have failed on its own.
pub type Field<T> = Result<T, GpuError>;

/// One device's readings in NVML's own units.
#[derive(Debug, Clone)]
pub struct RawReading {
    /// Index among the devices visible to this container.
    pub index: u32,
    /// The device's UUID.
    pub uuid: String,
    /// The product name.
    pub name: String,
    /// Percent of the last sample period a kernel was running.
    pub utilization_percent: Field<u32>,
    /// Memory used and total, bytes.
    pub memory_bytes: Field<(u64, u64)>,
    /// Power draw, milliwatts.
    pub power_milliwatts: Field<u32>,
    /// Die temperature, °C.
    pub temperature_celsius: Field<u32>,
    /// Energy used since the driver loaded, millijoules.
    pub energy_millijoules: Field<u64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Field<u32>,
    /// (pid, bytes) of processes using the device, when asked for.
    pub processes: Option<Field<Vec<(u32, u64)>>>,
}

/// Where GPU readings come from: NVML, the simulated GPU, or a fake in tests.
pub trait DeviceSource: Send + 'static {
    /// How many devices are visible.
    fn device_count(&mut self) -> Result<u32, GpuError>;
    /// Reads device `index`; an error means the whole device is unreadable (lost, gone).
    fn read(&mut self, index: u32, processes: bool) -> Result<RawReading, GpuError>;
}

/// One device at one instant, in SI units; a failed reading is `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceSnapshot {
    /// Index among the visible devices.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// 0–1.
    pub utilization_ratio: Option<f64>,
    /// Bytes.
    pub memory_used_bytes: Option<u64>,
    /// Bytes.
    pub memory_total_bytes: Option<u64>,
    /// Watts.
    pub power_watts: Option<f64>,
    /// °C.
    pub temperature_celsius: Option<f64>,
    /// Joules since the driver loaded (monotonic).
    pub energy_joules: Option<f64>,
    /// Hertz.
    pub sm_clock_hertz: Option<f64>,
    /// (pid, bytes), largest first, at most [`MAX_PROCESSES`].
    pub processes: Vec<(u32, u64)>,
}

/// Every device at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// When it was taken.
    pub taken_at: Instant,
    /// The devices that could be read.
    pub devices: Vec<DeviceSnapshot>,
}

/// Remembers which kinds of failure were warned about, so each is logged once an hour.
#[derive(Debug, Default)]
pub struct Warnings {
    last: HashMap<(&'static str, &'static str), Instant>,
}

impl Warnings {
    /// Logs `error` for `what` at warn level the first time in [`WARN_EVERY`], else at debug;
    /// returns whether it warned.
    pub fn report(&mut self, what: &'static str, error: &GpuError, now: Instant) -> bool {
        let key = (what, error.kind());
        let due = self
            .last
            .get(&key)
            .is_none_or(|at| now.duration_since(*at) >= WARN_EVERY);
        if due {
            self.last.insert(key, now);
            warn!(reading = what, %error, "GPU reading failed; its series are left out (warned once an hour)");
        } else {
            debug!(reading = what, %error, "GPU reading failed");
        }
        due
    }
}

/// Reads every device once and converts to SI units; failures drop only what failed.
pub fn sample(
    source: &mut dyn DeviceSource,
    processes: bool,
    warnings: &mut Warnings,
    now: Instant,
) -> Option<Snapshot> {
    let count = match source.device_count() {
        Ok(count) => count,
        Err(error) => {
            warnings.report("device_count", &error, now);
            return None;
        }
    };
    let mut devices = Vec::with_capacity(count as usize);
    for index in 0..count {
        match source.read(index, processes) {
            Ok(raw) => devices.push(convert(raw, warnings, now)),
            Err(error) => {
                warnings.report("device", &error, now);
            }
        }
    }
    Some(Snapshot { taken_at: now, devices })
}

fn convert(raw: RawReading, warnings: &mut Warnings, now: Instant) -> DeviceSnapshot {
    let mut processes = match raw.processes {
        Some(Ok(list)) => list,
        Some(Err(error)) => {
            warnings.report("processes", &error, now);
            Vec::new()
        }
        None => Vec::new(),
    };
    processes.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
    processes.truncate(MAX_PROCESSES);
    let mut ok = |what: &'static str, field: Field<f64>| match field {
        Ok(value) => Some(value),
        Err(error) => {
            warnings.report(what, &error, now);
            None
        }
    };
    let memory = ok("memory", raw.memory_bytes.clone().map(|(used, _)| used as f64));
    let memory_total = raw.memory_bytes.as_ref().ok().map(|(_, total)| *total);
    DeviceSnapshot {
        index: raw.index,
        uuid: raw.uuid,
        name: raw.name,
        utilization_ratio: ok("utilization", raw.utilization_percent.map(|p| f64::from(p) / 100.0)),
        memory_used_bytes: memory.map(|b| b as u64),
        memory_total_bytes: memory_total,
        power_watts: ok("power", raw.power_milliwatts.map(|mw| f64::from(mw) / 1000.0)),
        temperature_celsius: ok("temperature", raw.temperature_celsius.map(f64::from)),
        energy_joules: ok("energy", raw.energy_millijoules.map(|mj| mj as f64 / 1000.0)),
        sm_clock_hertz: ok("sm_clock", raw.sm_clock_mhz.map(|mhz| f64::from(mhz) * 1e6)),
        processes,
    }
}

/// The latest snapshot, shared by the sampler (writer) and the collector (reader).
#[derive(Debug)]
pub struct GpuState {
    interval: Duration,
    latest: RwLock<Option<Arc<Snapshot>>>,
}

impl GpuState {
    /// State for a sampler running every `interval`.
    pub fn new(interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            interval,
            latest: RwLock::new(None),
        })
    }

    /// Publishes a new snapshot (`None`: the devices could not be listed).
    pub fn publish(&self, snapshot: Option<Snapshot>) {
        *self.latest.write().expect("gpu snapshot lock") = snapshot.map(Arc::new);
    }

    /// The devices of the latest snapshot, unless it is stale (none then, or before the first).
    pub fn devices(&self, now: Instant) -> Vec<DeviceSnapshot> {
        self.fresh(now).0.map_or_else(Vec::new, |s| s.devices.clone())
    }

    /// A snapshot older than three intervals is stale: its values are not exported.
    fn fresh(&self, now: Instant) -> (Option<Arc<Snapshot>>, Option<Duration>) {
        let latest = self.latest.read().expect("gpu snapshot lock").clone();
        let age = latest.as_ref().map(|s| now.saturating_duration_since(s.taken_at));
        let stale_after = (self.interval * 3).max(Duration::from_secs(5));
        (latest.filter(|_| age.is_some_and(|a| a <= stale_after)), age)
    }
}

/// Samples every `interval` on a blocking thread until `shutdown`.
pub async fn run_sampler(
    source: Box<dyn DeviceSource>,
    processes: bool,
    state: Arc<GpuState>,
    shutdown: CancellationToken,
) {
    let shared = Arc::new(Mutex::new((source, Warnings::default())));
    loop {
        let job = shared.clone();
        let sampled = tokio::task::spawn_blocking(move || {
            let mut guard = job.lock().expect("gpu source lock");
            let (source, warnings) = &mut *guard;
            sample(source.as_mut(), processes, warnings, Instant::now())
        })
        .await;
        state.publish(sampled.ok().flatten());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(state.interval) => {}
        }
    }
}

/// `gpu`, `uuid`, `gpu_model`.
#[derive(Debug, EncodeLabelSet)]
struct DeviceLabels {
    gpu: String,
    uuid: String,
    gpu_model: String,
}

/// `gpu`, `uuid`, `pid`.
#[derive(Debug, EncodeLabelSet)]
struct ProcessLabels {
    gpu: String,
    uuid: String,
    pid: String,
}

/// Encodes the latest snapshot at scrape time.
#[derive(Debug)]
pub struct GpuCollector(pub Arc<GpuState>);

type Reading = fn(&DeviceSnapshot) -> Option<f64>;

const GAUGES: [(&str, &str, Reading); 6] = [
    (
        "llmslo_gpu_utilization_ratio",
        "Share of the last sample period a kernel ran (0-1)",
        |d| d.utilization_ratio,
    ),
    ("llmslo_gpu_memory_used_bytes", "Device memory in use", |d| {
        d.memory_used_bytes.map(|b| b as f64)
    }),
    ("llmslo_gpu_memory_total_bytes", "Device memory in all", |d| {
        d.memory_total_bytes.map(|b| b as f64)
    }),
    ("llmslo_gpu_power_watts", "Power draw", |d| d.power_watts),
    ("llmslo_gpu_temperature_celsius", "Die temperature", |d| {
        d.temperature_celsius
    }),
    ("llmslo_gpu_sm_clock_hertz", "Streaming multiprocessor clock", |d| {
        d.sm_clock_hertz
    }),
];

impl Collector for GpuCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (snapshot, age) = self.0.fresh(Instant::now());
        let up = encoder.encode_descriptor(
            "llmslo_gpu_up",
            "1 when the GPUs were read within the last three sample intervals",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(snapshot.is_some())).encode(up)?;
        if let Some(age) = age {
            let family = encoder.encode_descriptor(
                "llmslo_gpu_sample_age_seconds",
                "Age of the GPU snapshot being exported",
                None,
                MetricType::Gauge,
            )?;
            ConstGauge::new(age.as_secs_f64()).encode(family)?;
        }
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let labels = |d: &DeviceSnapshot| DeviceLabels {
            gpu: d.index.to_string(),
            uuid: d.uuid.clone(),
            gpu_model: d.name.clone(),
        };
        for (name, help, read) in GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for device in &snapshot.devices {
                if let Some(value) = read(device) {
                    ConstGauge::new(value).encode(family.encode_family(&labels(device))?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "llmslo_gpu_energy_joules",
            "Energy used since the driver loaded (monotonic)",
            None,
            MetricType::Counter,
        )?;
        for device in &snapshot.devices {
            if let Some(joules) = device.energy_joules {
                ConstCounter::new(joules).encode(family.encode_family(&labels(device))?)?;
            }
        }
        if snapshot.devices.iter().any(|d| !d.processes.is_empty()) {
            let mut family = encoder.encode_descriptor(
                "llmslo_gpu_process_memory_bytes",
                "Device memory used by each process on the GPU (the largest 16)",
                None,
                MetricType::Gauge,
            )?;
            for device in &snapshot.devices {
                for (pid, bytes) in &device.processes {
                    let labels = ProcessLabels {
                        gpu: device.index.to_string(),
                        uuid: device.uuid.clone(),
                        pid: pid.to_string(),
                    };
                    ConstGauge::new(*bytes as f64).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
