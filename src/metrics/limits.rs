//! The counters of the sidecar's own limits: work it refused to protect itself, clients cut
//! off by a deadline only their progress renews, and the connections open on the proxy port.
//! The accept loop, the guard and the observer count into them.

use super::labels::{ClientTimeoutLabels, RefusalLabels};
use super::{ClientTimeout, RefusalReason};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Handles to the limit families (cheap to clone: every clone counts into the same series).
#[derive(Debug, Clone, Default)]
pub struct LimitCounters {
    pub(super) refused: Family<RefusalLabels, Counter>,
    pub(super) client_timeouts: Family<ClientTimeoutLabels, Counter>,
    pub(super) open_connections: Gauge,
    /// Set once the drain deadline passed: what is dropped from then on was cut by the stop.
    cutting_at_shutdown: Arc<AtomicBool>,
}

impl LimitCounters {
    /// Counts work refused because a sidecar limit was reached.
    pub fn count_refused(&self, reason: RefusalReason) {
        self.refused.get_or_create(&RefusalLabels { reason }).inc();
    }

    /// Counts a client cut off by one of its deadlines.
    pub fn count_client_timeout(&self, timeout: ClientTimeout) {
        self.client_timeouts
            .get_or_create(&ClientTimeoutLabels { timeout })
            .inc();
    }

    /// Notes that the drain deadline passed: the responses dropped from now on are cut by the
    /// sidecar's stop, and say so (`shutdown`).
    pub fn cut_at_shutdown(&self) {
        self.cutting_at_shutdown.store(true, Ordering::Relaxed);
    }

    /// Whether the drain deadline passed.
    pub fn cutting_at_shutdown(&self) -> bool {
        self.cutting_at_shutdown.load(Ordering::Relaxed)
    }

    /// Counts one client connection open on the proxy port, until the guard is dropped.
    pub fn connection_opened(&self) -> GaugeGuard {
        GaugeGuard::new(self.open_connections.clone())
    }
}

/// Counts one in a gauge for as long as it lives: a request in flight, an open connection.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Increments `gauge` now; the drop decrements it.
    pub fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
