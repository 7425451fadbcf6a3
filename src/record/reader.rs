//! Whatever consumes what the observer measured: a [`Reader`] sees every finished request's
//! record and, where it needs them, the requests in flight. The sidecar's assembly gives the
//! observer one [`Readers`] fan-out of them all; none of them knows of the others.

use super::LabelText;
use super::{Engine, LegPhase, Operation, RequestRecord};
use std::sync::Arc;

/// A request as it begins (or is relabelled once the engine confirms its model).
#[derive(Debug, Clone, Copy)]
pub struct Started<'a> {
    /// Its normalised model label.
    pub model: &'a LabelText,
    /// Its operation.
    pub operation: Operation,
    /// The engine behind the sidecar, when known by now.
    pub provider: Option<Engine>,
}

/// A reader's part in one request in flight: it sees every gap between the stream's
/// token-carrying events, and is dropped when the request ends or is relabelled.
pub trait Ongoing: Send + Sync + std::fmt::Debug {
    /// One gap between token-carrying events, in seconds.
    fn gap(&self, seconds: f64);
}

/// Reads request records. Adding one to the sidecar is one implementation and one line in its
/// assembly; nothing else changes.
pub trait Reader: Send + Sync {
    /// Series for `model` should exist from now on, at zero (a model first seen, the engine
    /// identified, SLOs reloaded); `provider` is the engine as known now.
    fn model_known(&self, _model: &LabelText, _provider: Option<Engine>) {}

    /// A request began: what this reader keeps while it runs, if anything.
    fn started(&self, _request: &Started<'_>) -> Option<Arc<dyn Ongoing>> {
        None
    }

    /// A request ended: its record, exact (recorded once per request).
    fn finished(&self, record: &RequestRecord);

    /// A leg of a disaggregated request ended (`phase`): no user request, so no reader of
    /// requests counts it; those that count legs, or what loads the engine, read it here.
    fn leg_finished(&self, _record: &RequestRecord, _phase: LegPhase) {}

    /// A learned tenant was idle past its time and its slot given back: every series and
    /// window kept for it goes (they start again at zero if it comes back).
    fn tenant_forgotten(&self, _tenant: &LabelText) {}
}

/// Every reader of the sidecar, in the order the assembly gave them.
#[derive(Clone, Default)]
pub struct Readers(Vec<Arc<dyn Reader>>);

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Readers({})", self.0.len())
    }
}

impl Readers {
    /// The fan-out to `readers`.
    pub fn new(readers: Vec<Arc<dyn Reader>>) -> Self {
        Self(readers)
    }
}

impl Reader for Readers {
    fn model_known(&self, model: &LabelText, provider: Option<Engine>) {
        for reader in &self.0 {
            reader.model_known(model, provider);
        }
    }

    fn started(&self, request: &Started<'_>) -> Option<Arc<dyn Ongoing>> {
        let mut parts: Vec<_> = self.0.iter().filter_map(|reader| reader.started(request)).collect();
        match parts.len() {
            0 => None,
            1 => parts.pop(),
            _ => Some(Arc::new(Each(parts))),
        }
    }

    fn finished(&self, record: &RequestRecord) {
        for reader in &self.0 {
            reader.finished(record);
        }
    }

    fn leg_finished(&self, record: &RequestRecord, phase: LegPhase) {
        for reader in &self.0 {
            reader.leg_finished(record, phase);
        }
    }

    fn tenant_forgotten(&self, tenant: &LabelText) {
        for reader in &self.0 {
            reader.tenant_forgotten(tenant);
        }
    }
}

/// Several readers' parts in one request: each sees every gap.
#[derive(Debug)]
struct Each(Vec<Arc<dyn Ongoing>>);

impl Ongoing for Each {
    fn gap(&self, seconds: f64) {
        for part in &self.0 {
            part.gap(seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// Keeps what it is told, as `(what, detail)`.
    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<String>>);

    impl Ongoing for Log {
        fn gap(&self, seconds: f64) {
            self.0.lock().unwrap().push(format!("gap {seconds}"));
        }
    }

    impl Reader for Arc<Log> {
        fn model_known(&self, model: &LabelText, provider: Option<Engine>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("known {model} {}", Engine::label(provider)));
        }

        fn started(&self, request: &Started<'_>) -> Option<Arc<dyn Ongoing>> {
            self.0.lock().unwrap().push(format!("started {}", request.model));
            Some(self.clone())
        }

        fn finished(&self, record: &RequestRecord) {
            self.0.lock().unwrap().push(format!("finished {}", record.model));
        }
    }

    #[test]
    fn every_reader_sees_everything_in_order() {
        let (a, b) = (Arc::new(Log::default()), Arc::new(Log::default()));
        let readers = Readers::new(vec![Arc::new(a.clone()), Arc::new(b.clone())]);
        readers.model_known(&"llama".into(), Some(Engine::Vllm));
        let ongoing = readers
            .started(&Started {
                model: &"llama".into(),
                operation: Operation::Chat,
                provider: None,
            })
            .expect("both readers follow the request");
        ongoing.gap(0.02);
        readers.finished(&RequestRecord::new(
            "llama".into(),
            Operation::Chat,
            Duration::from_secs(1),
        ));
        for log in [a, b] {
            assert_eq!(
                *log.0.lock().unwrap(),
                ["known llama vllm", "started llama", "gap 0.02", "finished llama"]
            );
        }
    }

    #[test]
    fn no_reader_follows_a_request_unless_one_asks() {
        assert!(Readers::default()
            .started(&Started {
                model: &"m".into(),
                operation: Operation::Embeddings,
                provider: Some(Engine::Tgi),
            })
            .is_none());
    }
}
