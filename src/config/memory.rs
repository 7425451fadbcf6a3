//! What the sidecar's memory can reach under a config: the measured cost of each thing its
//! limits bound, summed for the worst case, to compare with the container's memory limit.

use super::Config;

/// Resident memory of a started sidecar before any traffic (runtime, registry, allocator).
pub const BASE_BYTES: u64 = 16 << 20;
/// Most one client connection holds: hyper's HTTP/1.1 read and write buffers and its task
/// (measured 22.6 KiB for a connection that sent half a request head, 23.3 KiB in a debug
/// build; an h2c connection holds 14 KiB), with room to spare.
pub const PER_CONNECTION_BYTES: u64 = 28 << 10;
/// Most one request in flight holds beyond its client connection: its engine connection, the
/// observer's state, its HTTP/2 stream (measured 16 KiB for an HTTP/1.1 stream, 22.6 KiB for
/// an h2c stream).
pub const PER_IN_FLIGHT_REQUEST_BYTES: u64 = 24 << 10;
/// What each sample kept from the engine's page costs beyond its text (its record, its place
/// in the family and the series index while it is read).
pub const PER_ENGINE_SAMPLE_BYTES: u64 = 64;
/// What each request kept for `/workload` costs: the row, and its copy in each page being
/// written at once.
pub const PER_RECENT_REQUEST_BYTES: u64 =
    (1 + crate::workload::recent::MAX_PAGES_AT_ONCE as u64) * crate::workload::recent::BYTES_PER_REQUEST as u64;
/// What the pages being written at once hold beyond their rows: a frame each.
pub const WORKLOAD_PAGES_BYTES: u64 =
    (crate::workload::recent::MAX_PAGES_AT_ONCE * crate::workload::recent::PAGE_FRAME_BYTES) as u64;
/// Most one parse of a peeked request body holds beyond the body, as a share of the largest
/// body peeked: the JSON reader's scratch for one escaped string it keeps (each escape is two
/// bytes or more and decodes to one or more); everything else is skipped in place, and the
/// strings kept are capped. A parse runs start to end on one worker thread, so at most one per
/// thread holds it.
pub const PARSE_SCRATCH_SHARE_OF_BODY: u64 = 2;
/// What the series of one tenant of one model cost, created at zero when either becomes known
/// (measured 39 KiB without SLOs, 62 KiB with four: the request, token and goodput families,
/// their place in the registry, and their share of a scrape's page while it is written).
pub const PER_TENANT_MODEL_BYTES: u64 = 40 << 10;
/// What each SLO adds to one tenant of one model (its events, bad events and windows).
pub const PER_TENANT_MODEL_SLO_BYTES: u64 = 6 << 10;
/// Where cgroup v2 states the container's memory limit.
const CGROUP_MEMORY_MAX: &str = "/sys/fs/cgroup/memory.max";

impl Config {
    /// The most memory the proxy can hold with every limit reached at once, running
    /// `worker_threads` threads: connections, requests in flight, the peek's buffer budget and
    /// each thread's parse of a body, an h2 engine's stream windows, and the engine's page, above
    /// the base (a tokenizer adds its
    /// own size; a compressed response its decoder window while it lasts), and the requests kept
    /// for `/workload`; with the prefill relay, its own connections and a leg for each request.
    pub fn worst_case_memory_bytes(&self, worker_threads: usize) -> u64 {
        BASE_BYTES
            + self.max_connections as u64 * PER_CONNECTION_BYTES
            + self.max_in_flight_requests as u64 * PER_IN_FLIGHT_REQUEST_BYTES
            + self.relay_bytes()
            + self.engine_h2_bytes()
            + self.max_buffered_request_bytes as u64
            + worker_threads as u64 * self.max_peek_bytes as u64 / PARSE_SCRATCH_SHARE_OF_BODY
            + self.engine_page_bytes()
            + self.recent_requests as u64 * PER_RECENT_REQUEST_BYTES
            + if self.recent_requests > 0 {
                WORKLOAD_PAGES_BYTES
            } else {
                0
            }
            + self.tenant_series_bytes()
    }

    /// The prefill relay at its bound: a leg for each request in flight, each on its own
    /// connection from the routing sidecar and with its own to the prefill pod (the relay takes
    /// no more connections than that).
    pub fn relay_bytes(&self) -> u64 {
        match self.prefill_relay {
            Some(_) => self.max_in_flight_requests as u64 * (PER_CONNECTION_BYTES + PER_IN_FLIGHT_REQUEST_BYTES),
            None => 0,
        }
    }

    /// An https engine that speaks h2: each request in flight may hold its stream's window of
    /// the engine's bytes unread here (over HTTP/1.1 they wait in the kernel's socket buffer).
    pub fn engine_h2_bytes(&self) -> u64 {
        match self.upstream.scheme_str() {
            Some("https") => self.max_in_flight_requests as u64 * u64::from(crate::upstream::H2_STREAM_WINDOW),
            _ => 0,
        }
    }

    /// The tenant families at their bound: every tenant label (the named ones, those learned,
    /// `unknown` and `other`) of every model label (those named, those learned, `other`).
    pub fn tenant_series_bytes(&self) -> u64 {
        if self.tenants.from.is_empty() {
            return 0;
        }
        let tenants = (self.tenants.pinned_count() + self.tenants.max_tenants + 2) as u64;
        let models = (self.models.len() + self.max_models + 1) as u64;
        let each = PER_TENANT_MODEL_BYTES + self.slos.slos.len() as u64 * PER_TENANT_MODEL_SLO_BYTES;
        tenants * models * each
    }

    /// The engine's page: its bytes while read, the text kept of it and each sample's record;
    /// with `merge`, the page kept between reads is written once more by each scrape.
    fn engine_page_bytes(&self) -> u64 {
        use crate::engine::EngineMetricsMode;
        let page = crate::config::defaults::ENGINE_METRICS_MAX_BYTES as u64;
        let parsed = page + self.engine_metrics_max_samples as u64 * PER_ENGINE_SAMPLE_BYTES;
        match self.engine_metrics {
            EngineMetricsMode::Off => 0,
            EngineMetricsMode::Map => page + parsed,
            EngineMetricsMode::Merge => 2 * page + parsed,
        }
    }
}

/// The container's memory limit (cgroup v2), when one is set.
pub fn container_limit_bytes() -> Option<u64> {
    parse_memory_max(&std::fs::read_to_string(CGROUP_MEMORY_MAX).ok()?)
}

/// `memory.max` holds a byte count, or `max` for no limit.
fn parse_memory_max(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_max_is_a_byte_count_or_no_limit() {
        assert_eq!(parse_memory_max("134217728\n"), Some(128 << 20));
        assert_eq!(parse_memory_max("max\n"), None);
    }
}
