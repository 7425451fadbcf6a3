//! Reads the engine's `/metrics` in the background, bounded in time and size, into the
//! [`EngineView`]. llmslo's own `/metrics` serves the last page read: a slow or huge engine
//! page never delays it.

use super::exposition;
use super::EngineView;
use crate::proxy::client::UpstreamClient;
use crate::proxy::error::innermost_cause;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
    let mut failing: Option<String> = None;
    loop {
        let started = Instant::now();
        let result = read_page(&client, &settings).await;
        let took = started.elapsed();
        match result {
            Ok(families) => {
                view.update(families, took);
                if failing.take().is_some() {
                    info!(path = %settings.path, "the engine's metrics can be read again");
                }
            }
            Err(reason) => {
                view.failed(took);
                if failing.is_none() {
                    warn!(path = %settings.path, %reason, "cannot read the engine's metrics: llmslo_engine_scrape_up is 0 \
                          and the engine's signals are left out until it can (traffic is not affected)");
                }
                failing = Some(reason);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(settings.interval) => {}
        }
    }
}

/// One bounded read and parse of the page; the error says why it failed, in a bounded line.
async fn read_page(client: &UpstreamClient, settings: &ScrapeSettings) -> Result<Vec<exposition::Family>, String> {
    let answer = tokio::time::timeout(
        settings.timeout,
        client.get_bounded(&settings.path, ACCEPT, settings.max_bytes),
    )
    .await
    .map_err(|_| format!("no answer within {}", humantime::format_duration(settings.timeout)))?
    .map_err(|error| innermost_cause(&error).to_string())?;
    match answer {
        (status, _) if !status.is_success() => Err(format!("answered {status}")),
        (_, None) => Err(format!("the page is over {} bytes, or broke off", settings.max_bytes)),
        (_, Some(body)) => {
            let text = std::str::from_utf8(&body).map_err(|_| "the page is not UTF-8".to_string())?;
            exposition::parse(text).map_err(|error| format!("not the Prometheus text format: {error}"))
        }
    }
}
