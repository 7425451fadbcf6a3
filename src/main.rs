//! The `llmslo` binary: a thin shell over the library's CLI.

use std::process::ExitCode;

/// jemalloc gives freed memory back to the system: after a burst of connections, glibc's
/// per-thread arenas kept RSS at its peak (12 → 101 MiB for 6,000 half-open connections, and
/// there it stayed), which a container's memory limit counts.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = llmslo::cli::Cli::parse_noting_sources();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    runtime.block_on(cli.run())
}
