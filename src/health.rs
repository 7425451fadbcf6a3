//! Upstream readiness and identity: a background probe of the engine's health path, and of
//! `/v1/models` until the engine has said what it is and serves.

use crate::observe::recorder::Recorder;
use crate::provider;
use crate::upstream::innermost_cause;
use crate::upstream::UpstreamClient;
use http::StatusCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Defaults of the readiness probe's settings (the config keys of the same names).
pub mod defaults {
    use std::time::Duration;

    /// `health_path`.
    pub const HEALTH_PATH: &str = "/health";
    /// `health_interval`.
    pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
}

/// Whether the engine is ready: its last probes succeeded, and recently.
#[derive(Debug)]
pub struct Readiness {
    last_ok: Mutex<Option<Instant>>,
    /// Two probes in a row failed.
    failing: AtomicBool,
    window: Duration,
}

impl Readiness {
    /// Ready means no two failed probes in a row since the last success, and a success within
    /// `window` (a backstop should the probe itself stall).
    pub fn new(window: Duration) -> Self {
        Self {
            last_ok: Mutex::new(None),
            failing: AtomicBool::new(false),
            window,
        }
    }

    /// Notes a successful probe at `now`.
    pub fn mark_ok(&self, now: Instant) {
        *self.last_ok.lock().expect("readiness lock") = Some(now);
        self.failing.store(false, Ordering::Relaxed);
    }

    /// Notes that the engine failed its probes `FAILURES_TO_UNREADY` times in a row.
    pub fn mark_failing(&self) {
        self.failing.store(true, Ordering::Relaxed);
    }

    /// True when the engine answered recently and is not failing.
    pub fn is_ready(&self) -> bool {
        !self.failing.load(Ordering::Relaxed)
            && self
                .last_ok
                .lock()
                .expect("readiness lock")
                .is_some_and(|at| at.elapsed() <= self.window)
    }
}

/// Failed probes in a row that make the engine unready: one slow or failed probe does not.
pub const FAILURES_TO_UNREADY: u32 = 2;
/// The most time between probes once one failed, and a probe's own timeout at least.
const RETRY: Duration = Duration::from_secs(1);

/// What the background probe checks and where it reports.
#[derive(Debug)]
pub struct Probe {
    /// The engine's health path.
    pub path: String,
    /// Time between probes while they succeed (also each probe's timeout, at least 1 s).
    pub interval: Duration,
    /// Where a successful probe is recorded.
    pub readiness: Arc<Readiness>,
    /// Told the engine kind and served models, once `/v1/models` answers.
    pub recorder: Arc<Recorder>,
}

/// The route probed instead when the engine answers 404 on its health path (llama-cpp-python
/// has no `/health`): every OpenAI-compatible engine answers it.
pub const FALLBACK_HEALTH_PATH: &str = "/v1/models";

/// Every `interval` until `shutdown`: learns what the engine serves (until it answers) and
/// probes its health path, or `/v1/models` once the health path answered 404. A failed probe
/// is retried within a second, and live traffic that could not connect to the engine triggers
/// a probe at once: readiness follows the engine within about two seconds, and one slow
/// probe never makes it unready.
pub async fn probe_upstream(client: UpstreamClient, probe: Probe, shutdown: CancellationToken) {
    let mut was_ready: Option<bool> = None;
    let mut identified = false;
    let mut path = probe.path.as_str();
    let mut failures = 0;
    let timeout = probe.interval.max(RETRY);
    loop {
        if !identified {
            identified = tokio::time::timeout(timeout, identify(&client, &probe.recorder))
                .await
                .unwrap_or(false);
        }
        let mut answer = tokio::time::timeout(timeout, client.get(path)).await;
        if matches!(answer, Ok(Ok((StatusCode::NOT_FOUND, _)))) && path != FALLBACK_HEALTH_PATH {
            info!(
                health_path = %probe.path,
                probing = FALLBACK_HEALTH_PATH,
                "the engine answers 404 on its health path: readiness follows {FALLBACK_HEALTH_PATH} instead"
            );
            path = FALLBACK_HEALTH_PATH;
            answer = tokio::time::timeout(timeout, client.get(path)).await;
        }
        let failure = match answer {
            Ok(Ok((status, _))) if status.is_success() => None,
            Ok(Ok((status, _))) => Some(format!("{path} answered {status}")),
            Ok(Err(error)) => Some(format!("{path}: {}", innermost_cause(&error))),
            Err(_) => Some(format!(
                "{path} did not answer within {}",
                humantime::format_duration(timeout)
            )),
        };
        failures = if failure.is_none() { 0 } else { failures + 1 };
        if failure.is_none() {
            probe.readiness.mark_ok(Instant::now());
        } else if failures >= FAILURES_TO_UNREADY {
            probe.readiness.mark_failing();
        }
        let ok = probe.readiness.is_ready();
        let failure = match (ok, failure) {
            (true, Some(reason)) => {
                // One failure is not enough to turn unready: look again within a second.
                debug!(%reason, "a health probe failed; probing again before turning unready");
                None
            }
            (true, None) => None,
            (false, reason) => Some(reason.unwrap_or_else(|| "no successful probe recently".into())),
        };
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
        let pause = if failures == 0 {
            probe.interval
        } else {
            probe.interval.min(RETRY)
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
            // A request could not reach the engine: probe now rather than at the next tick.
            _ = client.connect_failed(), if failures == 0 => {}
        }
    }
}

/// Asks `/v1/models` (then TGI's `/info`) what the engine is and serves; true once answered.
async fn identify(client: &UpstreamClient, recorder: &Recorder) -> bool {
    if let Ok((status, body)) = client.get("/v1/models").await {
        if let (true, Some((engine, models))) = (status.is_success(), provider::from_models(&body)) {
            recorder.learn_engine(engine);
            recorder.learn_models(&models);
            return true;
        }
    }
    if let Ok((status, body)) = client.get("/info").await {
        if let (true, Some(engine)) = (status.is_success(), provider::from_info(&body)) {
            recorder.learn_engine(engine);
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
