//! `sluice-budget-bench`: Reserve+Settle pairs a running sluice serves (see [`sluice_tools::budget_bench`]).

use std::process::ExitCode;

use clap::Parser;

/// Drive sluice's Reserve and Settle with many concurrent callers; report pairs per second.
#[derive(Debug, Parser)]
#[command(name = "sluice-budget-bench", version, about)]
struct Cli {
    #[command(flatten)]
    args: sluice_tools::budget_bench::BudgetBenchArgs,
}

fn main() -> ExitCode {
    let args = Cli::parse().args;
    sluice_tools::print_outcome(sluice_tools::budget_bench::run(&args))
}
