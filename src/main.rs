//! The `llmslo` binary: a thin shell over the library's CLI.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = llmslo::cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    runtime.block_on(cli.run())
}
