//! The load a request ran under, as the sidecar metered it on the whole engine.

/// The load one request ran under, in requests in flight (itself included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLoad {
    /// In flight when it arrived, itself included: the load its TTFT met.
    pub arrival: f64,
    /// Time-weighted mean in flight from its first token to its end: the load its decode met.
    pub decode: Option<f64>,
    /// Time-weighted mean in flight from its arrival to its end: the load its e2e met.
    pub whole: Option<f64>,
    /// Requests that arrived per second from its first token to its end: the prefills its
    /// decode shared steps with.
    pub decode_arrivals: Option<f64>,
}
