//! The tools beside the sidecar: the demo, the built-in simulated engine, the load sweep
//! that finds an engine's knee, and the overhead bench.

pub mod bench;
pub mod demo;
pub mod simulate;
pub mod sweep;
