//! Upstream readiness and identity: a background probe of the engine's health path, and of
//! `/v1/models` until the engine has said what it is and serves.

use crate::metrics::Metrics;
use crate::provider;
use crate::proxy::client::UpstreamClient;
use crate::proxy::error::innermost_cause;
use http::StatusCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// When the engine last answered its health path with a success status.
#[derive(Debug)]
pub struct Readiness {
    last_ok: Mutex<Option<Instant>>,
    window: Duration,
}

impl Readiness {
    /// Ready means a successful probe within `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            last_ok: Mutex::new(None),
            window,
        }
    }

    /// Notes a successful probe at `now`.
    pub fn mark_ok(&self, now: Instant) {
        *self.last_ok.lock().expect("readiness lock") = Some(now);
    }

    /// True when the engine answered recently.
    pub fn is_ready(&self) -> bool {
        self.last_ok
            .lock()
            .expect("readiness lock")
            .is_some_and(|at| at.elapsed() <= self.window)
    }
}

/// What the background probe checks and where it reports.
#[derive(Debug)]
pub struct Probe {
    /// The engine's health path.
    pub path: String,
    /// Time between probes (also each probe's timeout).
    pub interval: Duration,
    /// Where a successful probe is recorded.
    pub readiness: Arc<Readiness>,
    /// Told the engine kind and served models, once `/v1/models` answers.
    pub metrics: Arc<Metrics>,
}

/// The route probed instead when the engine answers 404 on its health path (llama-cpp-python
/// has no `/health`): every OpenAI-compatible engine answers it.
pub const FALLBACK_HEALTH_PATH: &str = "/v1/models";

/// Every `interval` until `shutdown`: learns what the engine serves (until it answers) and
/// probes its health path, or `/v1/models` once the health path answered 404.
pub async fn probe_upstream(client: UpstreamClient, probe: Probe, shutdown: CancellationToken) {
    let mut was_ready: Option<bool> = None;
    let mut identified = false;
    let mut path = probe.path.as_str();
    loop {
        if !identified {
            identified = tokio::time::timeout(probe.interval, identify(&client, &probe.metrics))
                .await
                .unwrap_or(false);
        }
        let mut answer = tokio::time::timeout(probe.interval, client.get(path)).await;
        if matches!(answer, Ok(Ok((StatusCode::NOT_FOUND, _)))) && path != FALLBACK_HEALTH_PATH {
            info!(
                health_path = %probe.path,
                probing = FALLBACK_HEALTH_PATH,
                "the engine answers 404 on its health path: readiness follows {FALLBACK_HEALTH_PATH} instead"
            );
            path = FALLBACK_HEALTH_PATH;
            answer = tokio::time::timeout(probe.interval, client.get(path)).await;
        }
        let failure = match answer {
            Ok(Ok((status, _))) if status.is_success() => None,
            Ok(Ok((status, _))) => Some(format!("{path} answered {status}")),
            Ok(Err(error)) => Some(format!("{path}: {}", innermost_cause(&error))),
            Err(_) => Some(format!(
                "{path} did not answer within {}",
                humantime::format_duration(probe.interval)
            )),
        };
        let ok = failure.is_none();
        if ok {
            probe.readiness.mark_ok(Instant::now());
        }
        // Logged once when readiness is lost (or never came), once when it comes back.
        match (&failure, was_ready) {
            (None, Some(true)) => {}
            (None, _) => info!(path, "upstream is ready"),
            (Some(reason), None | Some(true)) => {
                warn!(%reason, "upstream is not ready: /readyz answers 503 until it is")
            }
            (Some(reason), Some(false)) => debug!(%reason, "upstream still not ready"),
        }
        was_ready = Some(ok);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(probe.interval) => {}
        }
    }
}

/// Asks `/v1/models` (then TGI's `/info`) what the engine is and serves; true once answered.
async fn identify(client: &UpstreamClient, metrics: &Metrics) -> bool {
    if let Ok((status, body)) = client.get("/v1/models").await {
        if let (true, Some((engine, models))) = (status.is_success(), provider::from_models(&body)) {
            metrics.learn_engine(engine);
            metrics.learn_models(&models);
            return true;
        }
    }
    if let Ok((status, body)) = client.get("/info").await {
        if let (true, Some(engine)) = (status.is_success(), provider::from_info(&body)) {
            metrics.learn_engine(engine);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn readiness_expires_after_the_window() {
        let readiness = Readiness::new(Duration::from_secs(15));
        assert!(!readiness.is_ready());
        readiness.mark_ok(Instant::now());
        assert!(readiness.is_ready());
        tokio::time::advance(Duration::from_secs(16)).await;
        assert!(!readiness.is_ready());
    }
}
