//! The readers of the request record, composed: the Prometheus families, the SLO engine, the
//! capacity model, the OTLP exporter (when metric export is on), the record of recent requests
//! (when kept) and any reader given from
//! outside, all registered in one registry and given to the recorder as one fan-out. Adding a
//! reader is one line here.

use crate::capacity::meter::LoadMeter;
use crate::capacity::{CapacityEngine, DEFAULT_WINDOW};
use crate::cost::{CostMeter, CostSettings};
use crate::engine::{EngineCollector, EngineMetricsMode, EngineView};
use crate::gpu::{GpuCollector, GpuState};
use crate::metrics::buckets::BucketOverrides;
use crate::metrics::config_status::KeyTablesStatus;
use crate::metrics::disagg::DisaggFamilies;
use crate::metrics::requests::{Edges, RequestFamilies};
use crate::metrics::{Appended, Metrics, Registry};
use crate::observe::recorder::{Recorder, RecorderSettings};
use crate::observe::tenants::{KeysRead, TenantSettings, Tenants};
use crate::otel::metrics::{Boundaries, OtelMetrics};
use crate::proto;
use crate::record::{Reader, Readers, Role};
use crate::slo::spec::SloSet;
use crate::slo::SloEngine;
use crate::workload::recent::RecentRequests;
use opentelemetry::metrics::Meter;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info};

/// What the readers are built from.
pub struct MeasurementSettings {
    /// How requests are labelled.
    pub recorder: RecorderSettings,
    /// Per-family bucket overrides.
    pub buckets: BucketOverrides,
    /// The SLOs judged live; their latency thresholds become exact bucket edges.
    pub slos: SloSet,
    /// Whom requests serve (`tenants:`); no sources, no `tenant` label anywhere.
    pub tenants: TenantSettings,
    /// What the accelerators cost (`cost:`); no price, no cost families.
    pub cost: CostSettings,
    /// How far back the live capacity model looks (`capacity.window`).
    pub capacity_window: Duration,
    /// What is done with the engine's own `/metrics` (`engine_metrics`).
    pub engine_metrics: EngineMetricsMode,
    /// The meter OTLP metric export records into, when it is on.
    pub otlp: Option<Meter>,
    /// The GPUs' state, when GPU telemetry is on.
    pub gpu: Option<Arc<GpuState>>,
    /// Generation requests kept for `/workload` (0: none).
    pub recent_requests: usize,
    /// The pod's role in disaggregated serving.
    pub role: Role,
    /// Routers send this decode pod its decode legs (`decode_leg_sources` names them).
    pub routers_send_decode_legs: bool,
    /// The ports' TLS, whose certificate's expiry and reloads `/metrics` shows.
    pub tls: Option<Arc<crate::serve::tls::ServerTls>>,
    /// Readers beyond llmslo's own (the demo's table, a per-request log): each sees every
    /// request before llmslo's readers do.
    pub extra: Vec<Arc<dyn Reader>>,
}

impl Default for MeasurementSettings {
    fn default() -> Self {
        Self {
            recorder: RecorderSettings::default(),
            buckets: BucketOverrides::default(),
            slos: SloSet::default(),
            tenants: TenantSettings::default(),
            cost: CostSettings::default(),
            capacity_window: DEFAULT_WINDOW,
            engine_metrics: EngineMetricsMode::default(),
            otlp: None,
            gpu: None,
            recent_requests: 0,
            role: Role::default(),
            routers_send_decode_legs: false,
            tls: None,
            extra: Vec::new(),
        }
    }
}

/// The composed readers: where the observer records, and what `/metrics` encodes.
#[derive(Debug, Clone)]
pub struct Measurement {
    /// Where the observer records every request (give it to [`crate::ObserveLayer`]).
    pub recorder: Arc<Recorder>,
    /// Every reader's families, for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The SLO engine, for hot reloads.
    pub slo: Arc<SloEngine>,
    /// The engine's own `/metrics` as last read, for the scraper that reads them.
    pub engine_view: Arc<EngineView>,
    /// The recent requests `/workload` serves, when kept.
    pub recent: Option<Arc<RecentRequests>>,
    /// The tenants, when configured, for their key tables' reloads and idle slots.
    tenants: Option<Arc<Tenants>>,
    /// Every reader, told when a tenant is forgotten.
    readers: Readers,
    /// The key tables' gauges, when tenants read any.
    key_tables: Option<KeyTablesStatus>,
}

impl Measurement {
    /// Builds and registers every reader, in the order their families appear on `/metrics`.
    pub fn new(settings: MeasurementSettings) -> Self {
        let mut registry = Registry::default();
        let tenants = Tenants::new(&settings.tenants).map(Arc::new);
        if let Some(tenants) = &tenants {
            tenants.register(registry.families());
        }
        let known = tenants.as_ref().map(|t| t.known());
        let key_tables = tenants
            .as_ref()
            .and_then(|t| t.key_tables_status())
            .map(|(valid, keys)| {
                let status = KeyTablesStatus::default();
                status.set(valid, keys);
                status.register(registry.families());
                status
            });
        let slo = SloEngine::with_tenants(
            settings.slos.clone(),
            known.clone(),
            settings.tenants.gauges,
            registry.families(),
        );
        let load = Arc::new(LoadMeter::default());
        let capacity = CapacityEngine::new(
            settings.capacity_window,
            slo.clone(),
            settings.role,
            load.clone(),
            registry.families(),
        );
        let engine_view = EngineView::new(settings.engine_metrics);
        registry
            .families()
            .register_collector(Box::new(EngineCollector(engine_view.clone())));
        let edges = Edges::new(&settings.buckets, &settings.slos);
        let families = Arc::new(RequestFamilies::new(&edges, &settings.buckets, known, &mut registry));
        let disaggregation = Arc::new(DisaggFamilies::new(
            settings.role,
            settings.routers_send_decode_legs,
            edges.ttft.clone(),
            &mut registry,
        ));
        if let Some(tls) = &settings.tls {
            tls.register(registry.families());
        }
        if let Some(gpu) = &settings.gpu {
            registry
                .families()
                .register_collector(Box::new(GpuCollector(gpu.clone())));
        }
        let cost = settings.cost.enabled().then(|| {
            let slo = slo.clone();
            CostMeter::new(
                settings.cost.clone(),
                settings.slos.period,
                settings.gpu.clone(),
                Box::new(move || slo.set().service.clone()),
                registry.families(),
            )
        });

        // The tenants first: a learned tenant is seen before any series of it is made.
        let mut readers: Vec<Arc<dyn Reader>> = tenants.iter().map(|t| t.clone() as Arc<dyn Reader>).collect();
        readers.extend(settings.extra);
        readers.push(families.clone());
        readers.push(disaggregation);
        readers.push(slo.clone());
        readers.push(capacity);
        if let Some(cost) = cost {
            readers.push(cost);
        }
        let recent = (settings.recent_requests > 0).then(|| Arc::new(RecentRequests::new(settings.recent_requests)));
        if let Some(recent) = &recent {
            readers.push(recent.clone());
        }
        if let Some(meter) = &settings.otlp {
            readers.push(Arc::new(OtelMetrics::new(meter, boundaries(&edges))));
        }

        let merged = (settings.engine_metrics == EngineMetricsMode::Merge)
            .then(|| Arc::new(EnginePage(engine_view.clone())) as Arc<dyn Appended>);
        let read = (settings.engine_metrics != EngineMetricsMode::Off).then(|| engine_view.clone());
        let readers = Readers::new(readers);
        Self {
            recorder: Arc::new(
                Recorder::new(&settings.recorder, readers.clone(), load, read, families.limits())
                    .with_tenants(tenants.clone())
                    .with_role(settings.role),
            ),
            readers,
            metrics: Arc::new(registry.into_metrics(merged)),
            slo,
            engine_view,
            recent,
            tenants,
            key_tables,
        }
    }

    /// Reads the tenants' API-key tables again where their files changed, or all of them when
    /// `forced` (SIGHUP), and says how it went in the log and on `/metrics`.
    pub fn reload_key_tables(&self, forced: bool) {
        let (Some(tenants), Some(status)) = (&self.tenants, &self.key_tables) else {
            return;
        };
        for (path, read) in tenants.reload_key_tables(forced) {
            match read {
                KeysRead::Loaded(keys) => {
                    info!(path = %path.display(), keys, "API-key table read: its keys are in force")
                }
                KeysRead::Failed(error) => error!(
                    %error,
                    "API-key table not read: its last good keys stay in force (llmslo_tenant_api_keys_valid 0)"
                ),
            }
        }
        if let Some((valid, keys)) = tenants.key_tables_status() {
            status.set(valid, keys);
        }
    }

    /// How often to look for idle learned tenants; `None` without tenants.
    pub fn forget_tenants_every(&self) -> Option<Duration> {
        self.tenants.as_ref().map(|t| t.forget_every())
    }

    /// Gives back the slots of learned tenants idle past `tenants.forget_after`, removing
    /// their series from every reader.
    pub fn forget_idle_tenants(&self) {
        let Some(tenants) = &self.tenants else {
            return;
        };
        let forgotten = tenants.forget_idle(tokio::time::Instant::now(), |t| self.readers.tenant_forgotten(t));
        if !forgotten.is_empty() {
            info!(
                tenants = forgotten.len(),
                "learned tenants idle past tenants.forget_after: their slots are free and their series removed"
            );
        }
    }

    /// Puts new SLOs in force (hot reload); counters keep counting, and every known model
    /// gets its series for the new SLOs.
    pub fn reload_slos(&self, set: SloSet) {
        self.slo.reload(set);
        self.recorder.announce_models();
    }
}

/// The OTLP instruments' edges: the Prometheus families'.
fn boundaries(edges: &Edges) -> Boundaries {
    Boundaries {
        ttft: edges.ttft.edges().to_vec(),
        answer_ttft: edges.answer_ttft.edges().to_vec(),
        tpot: edges.tpot.edges().to_vec(),
        e2e: edges.e2e.edges().to_vec(),
        tokens: edges.tokens.edges().to_vec(),
        inter_chunk: edges.inter_chunk.edges().to_vec(),
        tokens_per_chunk: edges.tokens_per_chunk.edges().to_vec(),
        phases: edges.phases.edges().to_vec(),
        engine_tpot: edges.engine_tpot.edges().to_vec(),
    }
}

/// The engine's page, merged after llmslo's families (`engine_metrics: merge`).
struct EnginePage(Arc<EngineView>);

impl Appended for EnginePage {
    fn text(&self, own: &str) -> String {
        self.0.merged_families(own)
    }

    fn protobuf(&self, own: &HashSet<String>) -> Vec<proto::MetricFamily> {
        self.0.merged_protobuf(own.iter().map(String::as_str))
    }
}
