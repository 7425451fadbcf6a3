//! The `llmslo` binary: a thin shell over the library's CLI.

use std::process::ExitCode;

/// jemalloc gives freed memory back to the system: after a burst of connections, glibc's
/// per-thread arenas kept RSS at its peak (12 → 101 MiB for 6,000 half-open connections, and
/// there it stayed), which a container's memory limit counts.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once at start (`_RJEM_MALLOC_CONF` still overrides them): freed
/// pages go back to the system after 1 s instead of 10 s. A container's memory limit counts the
/// pages kept: about 2 KiB a stream at a hundred streams, given back for some twenty `madvise`
/// calls a second (docs/benchmarks.md, "The allocator's caches").
#[export_name = "_rjem_malloc_conf"]
static JEMALLOC_CONF: &[u8; 20] = b"dirty_decay_ms:1000\0";

fn main() -> ExitCode {
    let cli = llmslo::cli::Cli::parse_noting_sources();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = cli.worker_threads() {
        builder.worker_threads(threads);
    }
    let runtime = builder.enable_all().build().expect("building the tokio runtime");
    runtime.block_on(cli.run())
}
