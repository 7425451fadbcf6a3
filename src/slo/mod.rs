//! SLOs evaluated live: each finished request is classified per SLO, counted,
//! and added to sliding windows; error ratios, burn rates, budgets and goodput are computed
//! from those windows when Prometheus scrapes. `rules` turns the same SLO file into
//! Prometheus recording and alerting rules.

pub mod cause;
mod gauges;
mod judge;
pub mod rules;
pub mod spec;

use crate::fingerprint::hash_as_fingerprint;
use crate::record::{Engine, LabelText, Reader, RequestRecord};
use crate::tenant::TenantLabel;
use crate::window::Windows;
use gauges::SloCollector;
pub use gauges::Snapshot;
pub use judge::{classify, is_goodput, met_own_targets, Verdict};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use spec::{SloKind, SloSet};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use tokio::time::Instant;

/// `slo_service`, `slo`, `model`: the SLO file's service keeps two teams' SLOs of the same
/// name apart in fleet rules. (Not `service`: a ServiceMonitor attaches that target label,
/// the Kubernetes Service's name, and Prometheus would rename ours `exported_service`.)
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct SloLabels {
    /// The SLO file's `service`.
    pub slo_service: LabelText,
    /// The SLO's name.
    pub slo: LabelText,
    /// Normalised model.
    pub model: LabelText,
    /// The tenant, with tenants.
    #[prometheus(flatten)]
    pub tenant: TenantLabel,
}

/// `slo_service`, `model` (and `tenant`, with tenants): goodput is defined by an SLO file's
/// `goodput.require`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ServiceModelLabels {
    /// The SLO file's `service`.
    pub slo_service: LabelText,
    /// Normalised model.
    pub model: LabelText,
    /// The tenant, with tenants.
    #[prometheus(flatten)]
    pub tenant: TenantLabel,
}

/// `slo_service`, `slo`, `model`, `cause`, `evidence`: a bad event's cause and what it was
/// decided from.
#[derive(Debug, Clone, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    /// The SLO file's `service`.
    pub slo_service: LabelText,
    /// The SLO's name.
    pub slo: LabelText,
    /// Normalised model.
    pub model: LabelText,
    /// Why it was bad.
    pub cause: &'static str,
    /// What the cause was decided from.
    pub evidence: &'static str,
}

// Looked up at every request's end: hashed as their fingerprint, one word.
hash_as_fingerprint!(SloLabels: slo_service, slo, model, tenant);
hash_as_fingerprint!(ServiceModelLabels: slo_service, model, tenant);
hash_as_fingerprint!(CauseLabels: slo_service, slo, model, cause, evidence);

/// Per service and model: requests judged for goodput, goodput requests, goodput output tokens.
type GoodputWindows = Windows<3>;
/// Per SLO and model: events, bad events.
type SloWindows = Windows<2>;

#[derive(Debug, Default)]
struct State {
    slos: BTreeMap<SloLabels, SloWindows>,
    goodput: BTreeMap<ServiceModelLabels, GoodputWindows>,
}

/// The live SLO evaluation: counters, windows and the scrape-time gauges.
#[derive(Debug)]
pub struct SloEngine {
    set: RwLock<Arc<SloSet>>,
    started: Instant,
    state: Mutex<State>,
    events: Family<SloLabels, Counter>,
    bad_events: Family<SloLabels, Counter>,
    bad_events_by_cause: Family<CauseLabels, Counter>,
    goodput_judged: Family<ServiceModelLabels, Counter>,
    goodput_requests: Family<ServiceModelLabels, Counter>,
    goodput_tokens: Family<ServiceModelLabels, Counter>,
    /// Requests that stated latency targets of their own, judged by them.
    targets_judged: Family<ServiceModelLabels, Counter>,
    /// Those that succeeded and met every target they stated.
    targets_met: Family<ServiceModelLabels, Counter>,
    /// The capacity model's latest fit of TPOT against the requests sharing the decode, for
    /// the causes of the TPOT SLOs' bad events.
    decode_fit: Mutex<Option<cause::DecodeFit>>,
    /// The tenant labels whose series are created at zero: `[None]` without tenants.
    tenants: Vec<TenantLabel>,
    /// Whether the window gauges are per tenant too (`tenants.gauges`); otherwise each
    /// model's gauges sum its tenants, and only the counters carry `tenant`.
    tenant_gauges: bool,
}

impl SloEngine {
    /// An engine for `set`, registering its counters and gauges in `registry`.
    pub fn new(set: SloSet, registry: &mut Registry) -> Arc<Self> {
        Self::with_tenants(set, None, false, registry)
    }

    /// [`SloEngine::new`], with a `tenant` label on every SLO and goodput counter when
    /// `tenants` (those known from the start) are given, and on the window gauges too when
    /// `tenant_gauges`.
    pub fn with_tenants(
        set: SloSet,
        tenants: Option<Vec<LabelText>>,
        tenant_gauges: bool,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let engine = Arc::new(Self {
            set: RwLock::new(Arc::new(set)),
            started: Instant::now(),
            state: Mutex::new(State::default()),
            events: Family::default(),
            bad_events: Family::default(),
            bad_events_by_cause: Family::default(),
            goodput_judged: Family::default(),
            goodput_requests: Family::default(),
            goodput_tokens: Family::default(),
            targets_judged: Family::default(),
            targets_met: Family::default(),
            decode_fit: Mutex::new(None),
            tenants: match tenants {
                Some(known) => known.into_iter().map(|t| TenantLabel(Some(t))).collect(),
                None => vec![TenantLabel(None)],
            },
            tenant_gauges,
        });
        registry.register(
            "llmslo_slo_events",
            "Requests judged by each SLO",
            engine.events.clone(),
        );
        registry.register(
            "llmslo_slo_bad_events",
            "Requests that missed each SLO",
            engine.bad_events.clone(),
        );
        registry.register(
            "llmslo_slo_bad_events_by_cause",
            "Requests that missed each latency SLO, by cause (queueing, prefill, decode_contention, preemption, \
             outside_engine, unknown) and the evidence it was decided from (request, engine_metrics, load, none)",
            engine.bad_events_by_cause.clone(),
        );
        registry.register(
            "llmslo_goodput_judged_requests",
            "Generation requests judged for goodput: all but client errors and cancellations, and none \
             without SLOs",
            engine.goodput_judged.clone(),
        );
        registry.register(
            "llmslo_goodput_requests",
            "Successful requests that met every SLO under goodput.require",
            engine.goodput_requests.clone(),
        );
        registry.register(
            "llmslo_goodput_output_tokens",
            "Output tokens of goodput requests",
            engine.goodput_tokens.clone(),
        );
        registry.register(
            "llmslo_request_targets_judged_requests",
            "Generation requests that stated latency targets of their own (x-llm-d-slo-ttft-ms, ...), judged by \
             them apart from goodput: all but client errors and cancellations",
            engine.targets_judged.clone(),
        );
        registry.register(
            "llmslo_request_targets_met_requests",
            "Successful requests that met every latency target they stated themselves",
            engine.targets_met.clone(),
        );
        registry.register_collector(Box::new(SloCollector(engine.clone())));
        engine
    }

    /// The SLOs in force.
    pub fn set(&self) -> Arc<SloSet> {
        self.set.read().expect("slo set lock").clone()
    }

    /// Puts a new SLO set in force; windows of SLOs that keep their name (and service) keep
    /// their history.
    pub fn reload(&self, set: SloSet) {
        let mut state = self.state.lock().expect("slo state lock");
        state
            .slos
            .retain(|labels, _| set.slos.iter().any(|s| s.name == labels.slo));
        let old = self.set();
        if old.period != set.period || old.service != set.service {
            state.slos.clear();
            state.goodput.clear();
        }
        *self.set.write().expect("slo set lock") = Arc::new(set);
    }

    /// Creates `model`'s counters and windows at zero for every SLO.
    pub fn create_series(&self, model: &LabelText) {
        let set = self.set();
        let now = Instant::now();
        let mut state = self.state.lock().expect("slo state lock");
        for tenant in &self.tenants {
            for slo in &set.slos {
                let labels = SloLabels {
                    slo_service: set.service.clone(),
                    slo: slo.name.clone(),
                    model: model.clone(),
                    tenant: tenant.clone(),
                };
                drop(self.events.get_or_create(&labels));
                drop(self.bad_events.get_or_create(&labels));
                state
                    .slos
                    .entry(labels)
                    .or_insert_with(|| Windows::new(set.period, now));
            }
            let label = ServiceModelLabels {
                slo_service: set.service.clone(),
                model: model.clone(),
                tenant: tenant.clone(),
            };
            if set.judges_goodput() {
                drop(self.goodput_judged.get_or_create(&label));
                drop(self.goodput_requests.get_or_create(&label));
                drop(self.goodput_tokens.get_or_create(&label));
            }
            state
                .goodput
                .entry(label)
                .or_insert_with(|| Windows::new(set.period, now));
        }
    }

    /// Notes the capacity model's latest decode fit (none while it has none).
    pub fn note_decode_fit(&self, fit: Option<cause::DecodeFit>) {
        *self.decode_fit.lock().expect("decode fit lock") = fit;
    }

    /// Judges a finished request against every SLO and goodput, and finds the cause of each
    /// latency SLO it missed; `decode_fit` gives the capacity model's TPOT fit, when there is
    /// one.
    pub fn record(&self, record: &RequestRecord, decode_fit: impl FnOnce() -> Option<cause::DecodeFit>) {
        let set = self.set();
        let now = Instant::now();
        let verdicts: Vec<Verdict> = set.slos.iter().map(|slo| classify(slo, record)).collect();
        let missed_latency =
            |(slo, verdict): (&spec::Slo, &Verdict)| *verdict == Verdict::Bad && slo.kind != SloKind::Availability;
        // Asked only when a cause is to be found, and before the state lock is taken.
        let decode_fit = set
            .slos
            .iter()
            .zip(&verdicts)
            .any(missed_latency)
            .then(decode_fit)
            .flatten();
        let good = is_goodput(&set, record, &verdicts);
        let tokens = if good { record.output_tokens.unwrap_or(0) } else { 0 };

        let mut state = self.state.lock().expect("slo state lock");
        for (slo, verdict) in set.slos.iter().zip(&verdicts) {
            if *verdict == Verdict::NotCounted {
                continue;
            }
            let labels = SloLabels {
                slo_service: set.service.clone(),
                slo: slo.name.clone(),
                model: record.model.clone(),
                tenant: TenantLabel(record.tenant.clone()),
            };
            let bad = u64::from(*verdict == Verdict::Bad);
            self.events.get_or_create(&labels).inc();
            self.bad_events.get_or_create(&labels).inc_by(bad);
            if missed_latency((slo, verdict)) {
                let diagnosis = cause::diagnose(slo.kind, record, decode_fit);
                self.bad_events_by_cause
                    .get_or_create(&CauseLabels {
                        slo_service: labels.slo_service.clone(),
                        slo: labels.slo.clone(),
                        model: labels.model.clone(),
                        cause: diagnosis.cause.as_str(),
                        evidence: diagnosis.evidence.as_str(),
                    })
                    .inc();
            }
            let windows = state
                .slos
                .entry(labels)
                .or_insert_with(|| Windows::new(set.period, now));
            windows.add(now, [1, bad]);
        }
        // Goodput is generation's: embeddings and other pooling work are judged by their SLOs
        // only. Client errors and cancellations are never judged.
        if !record.operation.is_generation() {
            return;
        }
        let label = ServiceModelLabels {
            slo_service: set.service.clone(),
            model: record.model.clone(),
            tenant: TenantLabel(record.tenant.clone()),
        };
        if record.targets.any() && !record.outcome.is_not_the_services() {
            self.targets_judged.get_or_create(&label).inc();
            self.targets_met
                .get_or_create(&label)
                .inc_by(u64::from(met_own_targets(record)));
        }
        let windows = state
            .goodput
            .entry(label.clone())
            .or_insert_with(|| Windows::new(set.period, now));

        // Without SLOs, or trusted targets of its own, there is nothing to judge goodput by:
        // nothing is counted and its gauges read NaN (a success is not goodput by default).
        let trusted_targets = record.targets.any() && record.targets.trusted;
        let judged = (set.judges_goodput() || trusted_targets) && !record.outcome.is_not_the_services();
        if !judged {
            return;
        }
        self.goodput_judged.get_or_create(&label).inc();
        if good {
            self.goodput_requests.get_or_create(&label).inc();
            self.goodput_tokens.get_or_create(&label).inc_by(tokens);
        }
        windows.add(now, [1, u64::from(good), tokens]);
    }
}

impl Reader for SloEngine {
    fn model_known(&self, model: &LabelText, _provider: Option<Engine>) {
        self.create_series(model);
    }

    fn tenant_forgotten(&self, tenant: &LabelText) {
        let tenant = TenantLabel(Some(tenant.clone()));
        let mut state = self.state.lock().expect("slo state lock");
        state.slos.retain(|labels, _| {
            let keep = labels.tenant != tenant;
            if !keep {
                self.events.remove(labels);
                self.bad_events.remove(labels);
            }
            keep
        });
        state.goodput.retain(|label, _| {
            let keep = label.tenant != tenant;
            if !keep {
                for family in [
                    &self.goodput_judged,
                    &self.goodput_requests,
                    &self.goodput_tokens,
                    &self.targets_judged,
                    &self.targets_met,
                ] {
                    family.remove(label);
                }
            }
            keep
        });
    }

    fn finished(&self, record: &RequestRecord) {
        self.record(record, || *self.decode_fit.lock().expect("decode fit lock"));
    }
}

#[cfg(test)]
mod tests;
