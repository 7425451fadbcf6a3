//! Hot reload: the config file re-read on SIGHUP and when it changes, and new SLOs put in
//! force; the tenants' API-key tables re-read likewise.

use super::measurement::Measurement;
use crate::config::Config;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// How often the config file is checked for changes (a ConfigMap update, an edit).
const RELOAD_POLL: Duration = Duration::from_secs(2);

/// Re-reads the config file on SIGHUP and when its contents change, and puts the new SLOs
/// in force. A bad new file is rejected with a logged error; the running config stays.
pub(super) async fn reload_on_change(config: Config, measurement: Measurement, shutdown: CancellationToken) {
    let Some(path) = config.file.clone() else {
        return;
    };
    let read = || std::fs::read(&path).ok();
    let mut last = read();
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let signal = async {
            match hangup.as_mut() {
                Some(hangup) => hangup.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let signal = std::future::pending::<Option<()>>();
        let forced = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = signal => true,
            _ = tokio::time::sleep(RELOAD_POLL) => false,
        };
        // A rotated key Secret changes its table's file, not the config's.
        measurement.reload_key_tables(forced);
        let now = read();
        if !forced && now == last {
            continue;
        }
        last = now;
        match config.reload() {
            Ok(new) => {
                info!(slos = new.slos.slos.len(), path = %path.display(), "config reloaded: new SLOs in force (other settings apply at restart)");
                measurement.reload_slos(new.slos);
                measurement.metrics.config_status().loaded(true);
            }
            Err(error) => {
                error!(%error, "config reload rejected; the running config stays in force (llmslo_config_valid 0)");
                measurement.metrics.config_status().loaded(false);
            }
        }
    }
}
