//! `sluice-bench`: a load generator for a running sluice (see [`sluice_tools::bench`]).

use std::process::ExitCode;

use clap::Parser;

/// Run a load against a sluice server and report throughput and latency.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench", version, about)]
struct Cli {
    #[command(flatten)]
    args: sluice_tools::bench::BenchArgs,
}

fn main() -> ExitCode {
    sluice_tools::bench::main(Cli::parse().args)
}
