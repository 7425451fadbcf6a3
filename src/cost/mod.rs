//! What serving costs, as one reader of the request record: the pod's accelerators at their
//! price per hour (per GPU model where NVML names it, or one figure), plus their energy at a
//! price per kWh from NVML's energy counter; the cost over each SLO window split between
//! prefill and decode by tokens (an input token costs `input_token_weight` of an output
//! token's GPU time), giving the cost per million output and input tokens, each tenant's
//! share, and the cost SLOs' standing.
//!
//! Over a window, with `C` the cost, `O` and `I` the output and input tokens and `w` the input
//! weight: a million output tokens cost `C × 10⁶ / (O + w·I)`, a million input tokens
//! `w × C × 10⁶ / (O + w·I)`, and a tenant's share is `(O_t + w·I_t) / (O + w·I)`: the shares
//! add up to the whole.

use crate::gpu::GpuState;
use crate::record::{LabelText, Reader, RequestRecord};
use crate::tenant::TenantLabel;
use crate::window::{Windows, WINDOWS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// `cost.input_token_weight` when none is given: a prefill token takes about a tenth of a
/// decode token's GPU time in a busy batch.
pub const DEFAULT_INPUT_TOKEN_WEIGHT: f64 = 0.1;
/// How often a point of the cost's history is kept (the windows' resolution).
const HISTORY_STEP: Duration = Duration::from_secs(60);
/// How much history is kept: the longest window.
const HISTORY: Duration = Duration::from_secs(3 * 24 * 3600);

/// What a cost SLO bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostKind {
    /// `cost_per_million_output_tokens`.
    PerMillionOutputTokens,
    /// `cost_per_million_input_tokens`.
    PerMillionInputTokens,
}

impl CostKind {
    /// The key that names it in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            CostKind::PerMillionOutputTokens => "cost_per_million_output_tokens",
            CostKind::PerMillionInputTokens => "cost_per_million_input_tokens",
        }
    }
}

/// A cost SLO: a million tokens cost at most `target` over each window.
#[derive(Debug, Clone, PartialEq)]
pub struct CostSlo {
    /// Its name, unique among the cost SLOs.
    pub name: String,
    /// What it bounds.
    pub kind: CostKind,
    /// The most a million tokens may cost.
    pub target: f64,
}

/// `cost:`: the prices, and the cost SLOs. Without a price, cost is off.
#[derive(Debug, Clone, PartialEq)]
pub struct CostSettings {
    /// The price of one accelerator for an hour, for every model without its own price.
    pub gpu_hour_price: Option<f64>,
    /// The price per hour of each accelerator model, by the name NVML gives it.
    pub gpu_hour_prices: BTreeMap<String, f64>,
    /// How many accelerators the pod holds, where NVML cannot tell.
    pub gpus: u32,
    /// The price of a kWh, for the accelerators' energy (NVML's energy counter).
    pub energy_price_per_kwh: Option<f64>,
    /// The GPU time of an input token, relative to an output token's.
    pub input_token_weight: f64,
    /// The cost SLOs.
    pub slos: Vec<CostSlo>,
}

impl Default for CostSettings {
    fn default() -> Self {
        Self {
            gpu_hour_price: None,
            gpu_hour_prices: BTreeMap::new(),
            gpus: 1,
            energy_price_per_kwh: None,
            input_token_weight: DEFAULT_INPUT_TOKEN_WEIGHT,
            slos: Vec::new(),
        }
    }
}

impl CostSettings {
    /// Whether any price is given (cost is off without one).
    pub fn enabled(&self) -> bool {
        self.gpu_hour_price.is_some() || !self.gpu_hour_prices.is_empty()
    }
}

/// The cost since the sidecar started, kept at points over time.
#[derive(Debug)]
struct Spent {
    /// (when, cost spent by then), a point at most every [`HISTORY_STEP`], the last one the
    /// latest reading.
    history: VecDeque<(Instant, f64)>,
    /// The energy counter at the last reading, joules.
    last_energy: Option<f64>,
}

#[derive(Debug)]
struct State {
    spent: Spent,
    /// Per tenant: input and output tokens over each window.
    tokens: BTreeMap<TenantLabel, Windows<2>>,
}

/// The SLO file's service as it is now (a reload may change it).
pub type ServiceName = Box<dyn Fn() -> LabelText + Send + Sync>;

/// The live cost of the pod.
pub struct CostMeter {
    settings: CostSettings,
    period: Duration,
    gpu: Option<Arc<GpuState>>,
    service: ServiceName,
    state: Mutex<State>,
}

impl std::fmt::Debug for CostMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CostMeter")
            .field("settings", &self.settings)
            .field("service", &(self.service)())
            .finish_non_exhaustive()
    }
}

/// One window's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowCost {
    /// The window's name (`5m`, …).
    pub window: &'static str,
    /// The cost spent over it.
    pub cost: f64,
    /// A million output tokens' cost over it (NaN without tokens).
    pub per_million_output: f64,
    /// A million input tokens' cost over it (NaN without tokens).
    pub per_million_input: f64,
    /// Each tenant's share of it (with tenants).
    pub shares: Vec<(TenantLabel, f64)>,
}

/// The cost at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct CostSnapshot {
    /// The price of an hour now: the accelerators, and their energy at their current draw.
    pub per_hour: f64,
    /// The cost spent since the sidecar started.
    pub total: f64,
    /// The figures of every window.
    pub windows: Vec<WindowCost>,
}

impl CostMeter {
    /// A meter pricing as `settings` say, reading the GPUs' names and energy from `gpu`
    /// (when GPU telemetry is on), its counters registered in `registry`; its cost counter is
    /// labelled with the SLO file's service as `service` says it now.
    pub fn new(
        settings: CostSettings,
        period: Duration,
        gpu: Option<Arc<GpuState>>,
        service: ServiceName,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let now = Instant::now();
        let meter = Arc::new(Self {
            settings,
            period,
            gpu,
            service,
            state: Mutex::new(State {
                spent: Spent {
                    history: VecDeque::from([(now, 0.0)]),
                    last_energy: None,
                },
                tokens: BTreeMap::new(),
            }),
        });
        registry.register_collector(Box::new(CostCollector(meter.clone())));
        meter
    }

    /// The accelerators' price of an hour, and their power draw in watts (when known).
    fn hourly(&self, now: Instant) -> (f64, Option<f64>, Option<f64>) {
        let devices = self.gpu.as_ref().map(|gpu| gpu.devices(now)).unwrap_or_default();
        if devices.is_empty() {
            let price = self.settings.gpu_hour_price.unwrap_or(0.0) * f64::from(self.settings.gpus);
            return (price, None, None);
        }
        let price = devices
            .iter()
            .map(|d| {
                self.settings
                    .gpu_hour_prices
                    .get(&d.name)
                    .copied()
                    .or(self.settings.gpu_hour_price)
                    .unwrap_or(0.0)
            })
            .sum();
        let sum =
            |read: fn(&crate::gpu::DeviceSnapshot) -> Option<f64>| -> Option<f64> { devices.iter().map(read).sum() };
        (price, sum(|d| d.power_watts), sum(|d| d.energy_joules))
    }

    /// Brings the cost spent up to `now`; returns the price of an hour now.
    fn advance(&self, spent: &mut Spent, now: Instant) -> f64 {
        let (price, watts, energy) = self.hourly(now);
        let &(last_at, last) = spent.history.back().expect("the history starts with a point");
        let mut total = last + price * now.saturating_duration_since(last_at).as_secs_f64() / 3600.0;
        let kwh = self.settings.energy_price_per_kwh;
        if let (Some(kwh_price), Some(joules)) = (kwh, energy) {
            if let Some(before) = spent.last_energy.filter(|before| joules >= *before) {
                total += (joules - before) / 3.6e6 * kwh_price;
            }
            spent.last_energy = Some(joules);
        }
        let keeps_last = spent.history.len() >= 2
            && now.saturating_duration_since(spent.history[spent.history.len() - 2].0) < HISTORY_STEP;
        if keeps_last {
            spent.history.pop_back();
        }
        spent.history.push_back((now, total));
        while spent
            .history
            .get(1)
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > HISTORY)
        {
            spent.history.pop_front();
        }
        price + kwh.zip(watts).map_or(0.0, |(p, w)| w / 1000.0 * p)
    }

    /// Every figure at `now`.
    pub fn snapshot(&self, now: Instant) -> CostSnapshot {
        let weight = self.settings.input_token_weight;
        let mut state = self.state.lock().expect("cost lock");
        let per_hour = self.advance(&mut state.spent, now);
        let total = state.spent.history.back().map_or(0.0, |(_, total)| *total);
        let mut sums: Vec<(TenantLabel, [[u64; 2]; 7])> = Vec::new();
        for (tenant, windows) in &mut state.tokens {
            sums.push((tenant.clone(), windows.sums(now)));
        }
        let windows = WINDOWS
            .iter()
            .enumerate()
            .map(|(i, (window, length))| {
                let cost = total - spent_at(&state.spent.history, now.checked_sub(*length));
                let weighted = |[input, output]: [u64; 2]| output as f64 + weight * input as f64;
                let all: f64 = sums.iter().map(|(_, s)| weighted(s[i])).sum();
                let per_token = if all > 0.0 { cost * 1e6 / all } else { f64::NAN };
                let tenanted = sums.iter().filter(|(tenant, _)| tenant.0.is_some());
                WindowCost {
                    window,
                    cost,
                    per_million_output: per_token,
                    per_million_input: weight * per_token,
                    shares: tenanted
                        .map(|(tenant, s)| {
                            let share = if all > 0.0 { weighted(s[i]) / all } else { f64::NAN };
                            (tenant.clone(), share)
                        })
                        .collect(),
                }
            })
            .collect();
        CostSnapshot {
            per_hour,
            total,
            windows,
        }
    }
}

/// The cost spent by `at` (nothing before the history starts), between two points as the
/// line between them.
fn spent_at(history: &VecDeque<(Instant, f64)>, at: Option<Instant>) -> f64 {
    let Some(at) = at else {
        return 0.0;
    };
    let after = history.iter().position(|(t, _)| *t >= at);
    match after {
        None => history.back().map_or(0.0, |(_, v)| *v),
        Some(0) => history[0].1,
        Some(i) => {
            let ((t0, v0), (t1, v1)) = (history[i - 1], history[i]);
            let span = t1.saturating_duration_since(t0).as_secs_f64();
            let part = at.saturating_duration_since(t0).as_secs_f64();
            if span > 0.0 {
                v0 + (v1 - v0) * part / span
            } else {
                v1
            }
        }
    }
}

impl Reader for CostMeter {
    fn finished(&self, record: &RequestRecord) {
        let (input, output) = (record.input_tokens.unwrap_or(0), record.output_tokens.unwrap_or(0));
        if input == 0 && output == 0 {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock().expect("cost lock");
        state
            .tokens
            .entry(TenantLabel(record.tenant.clone()))
            .or_insert_with(|| Windows::new(self.period, now))
            .add(now, [input, output]);
    }

    fn tenant_forgotten(&self, tenant: &LabelText) {
        let mut state = self.state.lock().expect("cost lock");
        state.tokens.remove(&TenantLabel(Some(tenant.clone())));
    }
}

#[derive(Debug, EncodeLabelSet)]
struct ServiceLabels {
    slo_service: LabelText,
}

#[derive(Debug, EncodeLabelSet)]
struct WindowLabels {
    window: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct TenantWindowLabels {
    #[prometheus(flatten)]
    tenant: TenantLabel,
    window: &'static str,
}

#[derive(Debug, EncodeLabelSet)]
struct SloWindowLabels {
    slo: String,
    window: &'static str,
}

/// Encodes the cost at scrape time.
#[derive(Debug)]
struct CostCollector(Arc<CostMeter>);

impl Collector for CostCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.snapshot(Instant::now());
        let gauge = MetricType::Gauge;
        ConstGauge::new(s.per_hour).encode(encoder.encode_descriptor(
            "llmslo_cost_per_hour",
            "What an hour of the pod's accelerators costs now, with their energy at their current draw \
             (in the currency of the configured prices)",
            None,
            gauge,
        )?)?;
        // The service tells two services' pods apart in one namespace (their cost rules).
        ConstCounter::new(s.total).encode(
            encoder
                .encode_descriptor(
                    "llmslo_cost",
                    "What the pod's accelerators (and their energy) cost since the sidecar started, by the SLO \
                     file's service",
                    None,
                    MetricType::Counter,
                )?
                .encode_family(&ServiceLabels {
                    slo_service: (self.0.service)(),
                })?,
        )?;
        let per_window = |encoder: &mut DescriptorEncoder, name: &str, help: &str, read: fn(&WindowCost) -> f64| {
            let mut family = encoder.encode_descriptor(name, help, None, gauge)?;
            for w in &s.windows {
                ConstGauge::new(read(w)).encode(family.encode_family(&WindowLabels { window: w.window })?)?;
            }
            Ok::<_, std::fmt::Error>(())
        };
        per_window(
            &mut encoder,
            "llmslo_cost_over_window",
            "What the pod cost over the window (over its uptime, while shorter)",
            |w| w.cost,
        )?;
        per_window(
            &mut encoder,
            "llmslo_cost_per_million_output_tokens",
            "What a million output tokens cost over the window: its cost x 1e6 / (output + input_token_weight x input tokens)",
            |w| w.per_million_output,
        )?;
        per_window(
            &mut encoder,
            "llmslo_cost_per_million_input_tokens",
            "What a million input tokens cost over the window: input_token_weight x a million output tokens' cost",
            |w| w.per_million_input,
        )?;
        if s.windows.iter().any(|w| !w.shares.is_empty()) {
            let mut family = encoder.encode_descriptor(
                "llmslo_cost_tenant_share_ratio",
                "Each tenant's share of the window's cost: its weighted tokens over all (the shares add up to 1)",
                None,
                gauge,
            )?;
            for w in &s.windows {
                for (tenant, share) in &w.shares {
                    let labels = TenantWindowLabels {
                        tenant: tenant.clone(),
                        window: w.window,
                    };
                    ConstGauge::new(*share).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        if !self.0.settings.slos.is_empty() {
            let mut family = encoder.encode_descriptor(
                "llmslo_cost_slo_ratio",
                "Each cost SLO's figure over the window divided by its target: above 1, the SLO is missed",
                None,
                gauge,
            )?;
            for slo in &self.0.settings.slos {
                for w in &s.windows {
                    let figure = match slo.kind {
                        CostKind::PerMillionOutputTokens => w.per_million_output,
                        CostKind::PerMillionInputTokens => w.per_million_input,
                    };
                    let labels = SloWindowLabels {
                        slo: slo.name.clone(),
                        window: w.window,
                    };
                    ConstGauge::new(figure / slo.target).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
