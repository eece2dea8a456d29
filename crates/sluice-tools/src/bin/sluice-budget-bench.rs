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
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sluice_tools::budget_bench::run(&args)) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
