//! Upstream readiness: a background probe of the engine's health path.

use crate::proxy::client::UpstreamClient;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// When the engine last answered its health path with a success status.
#[derive(Debug, Default)]
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

/// Probes `path` on the upstream every `interval` until `shutdown`.
pub async fn probe_upstream(
    client: UpstreamClient,
    path: String,
    interval: Duration,
    readiness: std::sync::Arc<Readiness>,
    shutdown: CancellationToken,
) {
    let mut was_ready = false;
    loop {
        let ok = matches!(
            tokio::time::timeout(interval, client.get_status(&path)).await,
            Ok(Ok(status)) if status.is_success()
        );
        if ok {
            readiness.mark_ok(Instant::now());
        } else {
            debug!(path = %path, "upstream health probe failed");
        }
        if ok != was_ready {
            info!(ready = ok, "upstream readiness changed");
            was_ready = ok;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
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
