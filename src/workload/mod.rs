//! The workload a sidecar sees, without a word of it: request traces (read and written), the
//! rolling record of recent requests the sidecar serves as one, and the shape (rate,
//! burstiness, mix and lengths) a sweep loads a target with.

pub mod recent;
pub mod shape;
pub mod trace;
