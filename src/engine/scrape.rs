//! Reads the engine's `/metrics` in the background, bounded in time and size, into the
//! [`EngineView`]. llmslo's own `/metrics` serves the last page read: a slow or huge engine
//! page never delays it.

use super::exposition;
use super::EngineView;
use crate::upstream::innermost_cause;
use crate::upstream::UpstreamClient;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Defaults of the engine-page reader's settings (the config keys of the same names).
pub mod defaults {
    use std::time::Duration;

    /// `engine_metrics_max_samples`: a vLLM page has about 1,000; each kept sample costs about
    /// 150 bytes.
    pub const ENGINE_METRICS_MAX_SAMPLES: usize = 20_000;
    /// `engine_metrics_path`.
    pub const ENGINE_METRICS_PATH: &str = "/metrics";
    /// `engine_metrics_interval`.
    pub const ENGINE_METRICS_INTERVAL: Duration = Duration::from_secs(5);
    /// The longest one read of the engine's metrics may take.
    pub const ENGINE_METRICS_TIMEOUT: Duration = Duration::from_secs(2);
    /// The largest engine metrics page read.
    pub const ENGINE_METRICS_MAX_BYTES: usize = 4 << 20;
}

/// Where and how often the engine's page is read.
#[derive(Debug, Clone)]
pub struct ScrapeSettings {
    /// Its path on the upstream (`/metrics`).
    pub path: String,
    /// Time between reads.
    pub interval: Duration,
    /// Longest one read may take (then it failed).
    pub timeout: Duration,
    /// Largest page read (a longer one failed).
    pub max_bytes: usize,
    /// Most samples (and families) kept from one page (a page with more failed).
    pub max_samples: usize,
}

/// Text format 0.0.4 first: the format the merge rewrites (OpenMetrics is refused by few).
const ACCEPT: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";

/// Reads the engine's page every `settings.interval` until `shutdown`.
pub async fn scrape_engine(
    client: UpstreamClient,
    view: Arc<EngineView>,
    settings: ScrapeSettings,
    shutdown: CancellationToken,
) {
    let mut failing = false;
    let mut ever_read = false;
    loop {
        let started = Instant::now();
        let result = read_page(&client, &settings).await;
        let took = started.elapsed();
        match result {
            Ok(families) => {
                view.update(families, took);
                if std::mem::take(&mut failing) {
                    info!(path = %settings.path, "the engine's metrics can be read again");
                }
                ever_read = true;
            }
            Err(failure) => {
                view.failed(took);
                // An engine still loading its model answers nothing yet: not worth a warning
                // until it has answered once (readiness says when it is up).
                if !failing && (ever_read || failure.answered) {
                    warn!(path = %settings.path, reason = %failure.reason, "cannot read the engine's metrics: \
                          llmslo_engine_scrape_up is 0 and the engine's signals are left out until it can (traffic \
                          is not affected); set engine_metrics_path, or engine_metrics: off for an engine that has none");
                    failing = true;
                } else {
                    debug!(path = %settings.path, reason = %failure.reason, "cannot read the engine's metrics");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
    }
}

/// Why a read failed, in a bounded line.
struct Failure {
    reason: String,
    /// The engine answered (a wrong status or page), rather than not at all.
    answered: bool,
}

/// One bounded read and parse of the page.
async fn read_page(client: &UpstreamClient, settings: &ScrapeSettings) -> Result<exposition::Page, Failure> {
    let silent = |reason: String| Failure {
        reason,
        answered: false,
    };
    let answered = |reason: String| Failure { reason, answered: true };
    let answer = tokio::time::timeout(
        settings.timeout,
        client.get_bounded(&settings.path, ACCEPT, settings.max_bytes),
    )
    .await
    .map_err(|_| {
        silent(format!(
            "no answer within {}",
            humantime::format_duration(settings.timeout)
        ))
    })?
    .map_err(|error| silent(innermost_cause(&error)))?;
    match answer {
        (status, _) if !status.is_success() => Err(answered(format!("answered {status}"))),
        (_, None) => Err(answered(format!(
            "the page is over {} bytes, or broke off",
            settings.max_bytes
        ))),
        (_, Some(body)) => {
            // Parsed on a blocking thread: a large page never holds a runtime worker.
            let max_samples = settings.max_samples;
            let parsed = tokio::task::spawn_blocking(move || {
                let text = std::str::from_utf8(&body).map_err(|_| "the page is not UTF-8".to_string())?;
                exposition::parse(text, max_samples).map_err(|error| error.to_string())
            })
            .await
            .map_err(|error| answered(format!("the page's read failed: {error}")))?;
            parsed.map_err(answered)
        }
    }
}
