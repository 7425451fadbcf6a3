//! Where observed requests go: the recorder labels each request's model and engine, meters
//! the load it runs under, notes what the engine's `/metrics` showed around it, and hands its
//! record to the readers (the one fan-out the sidecar's assembly composed).

use super::models::ModelNames;
use super::tenants::{BodyIds, TenantFields, Tenants};
use crate::capacity::meter::{InFlight, LoadMeter};
use crate::engine::EngineView;
use crate::metrics::limits::LimitCounters;
use crate::provider::Provider;
use crate::record::{
    Engine, EngineMoment, LabelText, LegPhase, Ongoing, Operation, PerRequestSlos, Reader, Readers, RequestRecord,
    RequestTargets, Role, Started, TenantSource,
};
use http::{HeaderMap, HeaderName};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::info;

/// The headers a request states its own TTFT target in, milliseconds: llm-d's, then ours.
static TTFT_TARGET: [HeaderName; 2] = [
    HeaderName::from_static("x-llm-d-slo-ttft-ms"),
    HeaderName::from_static("x-slo-ttft-ms"),
];

/// The headers a request states its own TPOT target in, milliseconds.
static TPOT_TARGET: [HeaderName; 2] = [
    HeaderName::from_static("x-llm-d-slo-tpot-ms"),
    HeaderName::from_static("x-slo-tpot-ms"),
];

/// How the recorder labels requests.
#[derive(Debug, Clone)]
pub struct RecorderSettings {
    /// The configured engine (the `provider` label); `None` learns it.
    pub engine: Option<Engine>,
    /// Model allow-list; empty means learn up to `max_models`.
    pub models: Vec<String>,
    /// How many distinct models are learned before the rest become `other`.
    pub max_models: usize,
    /// How a request's own latency targets (`x-llm-d-slo-ttft-ms`, …) judge its goodput.
    pub per_request_slos: PerRequestSlos,
}

impl Default for RecorderSettings {
    fn default() -> Self {
        Self {
            engine: None,
            models: Vec::new(),
            max_models: super::models::DEFAULT_MAX_MODELS,
            per_request_slos: PerRequestSlos::default(),
        }
    }
}

/// The observer's side of the readers: what every measured request is labelled with, and
/// where its record goes.
#[derive(Debug)]
pub struct Recorder {
    readers: Readers,
    provider: Provider,
    models: ModelNames,
    /// Generation requests in flight on the engine (the capacity model reads it too).
    load: Arc<LoadMeter>,
    /// The engine's `/metrics` as last read, when llmslo reads them.
    engine_view: Option<Arc<EngineView>>,
    limits: LimitCounters,
    /// Whom requests serve, when tenants are configured.
    tenants: Option<Arc<Tenants>>,
    per_request_slos: PerRequestSlos,
    /// The pod's role in disaggregated serving.
    role: Role,
}

/// What a request holds from its start to its end.
#[derive(Debug)]
pub struct RequestHandles {
    /// The request's normalised model.
    pub model: LabelText,
    /// A model name the request named that is not known yet: learned on a successful answer.
    pub candidate: Option<String>,
    /// The request's operation.
    pub operation: Operation,
    /// The readers' part in the request while it runs (its in-flight count, its gaps).
    pub ongoing: Option<Arc<dyn Ongoing>>,
    /// The request counted in the engine's load meter (generation requests only: pooling
    /// work does not run on the decode loop).
    pub load: Option<InFlight>,
}

impl Recorder {
    /// A recorder labelling as `settings` say, metering into `load`, noting `engine_view`
    /// (when the engine's page is read) and recording into `readers`; the known models'
    /// series are created at once.
    pub fn new(
        settings: &RecorderSettings,
        readers: Readers,
        load: Arc<LoadMeter>,
        engine_view: Option<Arc<EngineView>>,
        limits: LimitCounters,
    ) -> Self {
        let recorder = Self {
            tenants: None,
            per_request_slos: settings.per_request_slos,
            readers,
            provider: Provider::new(settings.engine),
            models: ModelNames::new(&settings.models, settings.max_models),
            load,
            engine_view,
            limits,
            role: Role::default(),
        };
        recorder.announce_models();
        recorder
    }

    /// Labels requests with their tenant as `tenants` read them.
    pub fn with_tenants(mut self, tenants: Option<Arc<Tenants>>) -> Self {
        self.tenants = tenants;
        self
    }

    /// Labels requests as a pod in `role` serves them.
    pub fn with_role(mut self, role: Role) -> Self {
        self.role = role;
        self
    }

    /// The pod's role in disaggregated serving.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The request's tenant label and the source that named it, when tenants are configured.
    pub fn tenant(&self, headers: &HeaderMap, body: BodyIds<'_>) -> Option<(LabelText, Option<TenantSource>)> {
        self.tenants.as_ref().map(|tenants| tenants.label(headers, body))
    }

    /// The body fields the tenants are read from (none when tenants are off).
    pub fn tenant_body_fields(&self) -> TenantFields {
        self.tenants.as_ref().map(|t| t.body_fields()).unwrap_or_default()
    }

    /// The latency targets the request states itself, when per-request SLOs are on.
    pub fn targets(&self, headers: &HeaderMap) -> RequestTargets {
        if self.per_request_slos == PerRequestSlos::Off {
            return RequestTargets::default();
        }
        let ms = |names: &[HeaderName; 2]| {
            names.iter().find_map(|name| {
                let value: f64 = headers.get(name)?.to_str().ok()?.trim().parse().ok()?;
                (value.is_finite() && value > 0.0 && value < 1e9).then(|| Duration::from_secs_f64(value / 1e3))
            })
        };
        RequestTargets {
            ttft: ms(&TTFT_TARGET),
            tpot: ms(&TPOT_TARGET),
            trusted: self.per_request_slos == PerRequestSlos::Trusted,
        }
    }

    /// The engine, when configured or learned.
    pub fn engine(&self) -> Option<Engine> {
        self.provider.engine()
    }

    /// The `provider` label value now.
    pub fn provider(&self) -> &'static str {
        self.provider.label()
    }

    /// The counters of the sidecar's own limits.
    pub fn limits(&self) -> &LimitCounters {
        &self.limits
    }

    /// Records the engine `auto` learned; the known models' series are created under it.
    pub fn learn_engine(&self, engine: Engine) {
        if self.provider.learn(engine) {
            info!(provider = engine.as_str(), "identified the engine");
            self.announce_models();
        }
    }

    /// Learns the models the engine serves (when no allow-list is configured), so their
    /// series exist at zero before the first request; the only one names model-less requests.
    pub fn learn_models(&self, ids: &[String]) {
        self.models.set_served(ids);
        for id in ids {
            let (model, first_seen) = self.models.learn(id);
            if first_seen {
                self.readers.model_known(&model, self.engine());
            }
        }
    }

    /// Tells every reader every known model again (the SLOs were reloaded).
    pub fn announce_models(&self) {
        for model in self.models.known() {
            self.readers.model_known(&model, self.engine());
        }
    }

    /// Starts recording a request that arrived at `now`: labels its model (a name not known
    /// yet is `other` until the engine answers it successfully) and counts it in flight.
    pub fn start(&self, raw_model: Option<&str>, operation: Operation, now: Instant) -> RequestHandles {
        let mut handles = self.start_leg(raw_model, operation, now);
        handles.ongoing = self.started(&handles.model, operation);
        handles
    }

    /// Starts recording a leg of a disaggregated request: labelled and counted in the engine's
    /// load as a request is, but no reader sees it start.
    pub fn start_leg(&self, raw_model: Option<&str>, operation: Operation, now: Instant) -> RequestHandles {
        let (model, candidate) = self.models.label(raw_model);
        RequestHandles {
            ongoing: None,
            load: operation
                .is_generation()
                .then(|| InFlight::arrive(self.load.clone(), now)),
            model,
            candidate,
            operation,
        }
    }

    /// The engine answered the request successfully: a model name it named that was not known
    /// yet is learned (within `max_models`), and the request is labelled with it from now on.
    pub fn confirm_model(&self, handles: &mut RequestHandles) {
        let Some(candidate) = handles.candidate.take() else {
            return;
        };
        let (model, first_seen) = self.models.learn(&candidate);
        if first_seen {
            self.readers.model_known(&model, self.engine());
        }
        if model != handles.model {
            // The load meter is the engine's: the request stays counted as it arrived.
            if handles.ongoing.is_some() {
                handles.ongoing = self.started(&model, handles.operation);
            }
            handles.model = model;
        }
    }

    fn started(&self, model: &LabelText, operation: Operation) -> Option<Arc<dyn Ongoing>> {
        self.readers.started(&Started {
            model,
            operation,
            provider: self.engine(),
        })
    }

    /// What the engine's `/metrics` show now, when llmslo reads them.
    pub fn engine_moment(&self) -> Option<EngineMoment> {
        self.engine_view.as_ref().map(|view| view.moment())
    }

    /// Hands a finished request's record to every reader.
    pub fn finish(&self, record: &RequestRecord) {
        self.readers.finished(record);
    }

    /// Hands a finished leg to the readers that read legs: no reader of requests sees it.
    pub fn finish_leg(&self, record: &RequestRecord, phase: LegPhase) {
        self.readers.leg_finished(record, phase);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Keeps the address of every model label it is handed.
    #[derive(Debug, Default)]
    struct Addresses(Mutex<Vec<usize>>);

    impl Addresses {
        fn note(&self, model: &LabelText) {
            self.0.lock().unwrap().push(model.as_str().as_ptr() as usize);
        }
    }

    impl Reader for Addresses {
        fn model_known(&self, model: &LabelText, _provider: Option<Engine>) {
            self.note(model);
        }

        fn started(&self, request: &Started<'_>) -> Option<Arc<dyn Ongoing>> {
            self.note(request.model);
            None
        }

        fn finished(&self, record: &RequestRecord) {
            self.note(&record.model);
        }
    }

    #[tokio::test]
    async fn every_reader_is_handed_one_shared_label_for_a_model() {
        let addresses = Arc::new(Addresses::default());
        let settings = RecorderSettings {
            engine: Some(Engine::Vllm),
            ..RecorderSettings::default()
        };
        let readers = Readers::new(vec![addresses.clone()]);
        let recorder = Recorder::new(&settings, readers, Arc::default(), None, LimitCounters::default());
        recorder.learn_models(&["llama".into()]);
        for _ in 0..2 {
            let handles = recorder.start(Some("llama"), Operation::Chat, Instant::now());
            recorder.finish(&RequestRecord::new(handles.model, Operation::Chat, Duration::ZERO));
        }
        let seen = addresses.0.lock().unwrap();
        assert_eq!(seen.len(), 5, "known once, then started and finished twice");
        assert!(seen.iter().all(|a| *a == seen[0]), "one text, never a copy: {seen:?}");
    }
}
