//! `sluice-quota-bench`: RLQS usage reports a running sluice absorbs (see [`sluice_tools::quota_bench`]).

use std::process::ExitCode;

use clap::Parser;

/// Drive sluice's Rate Limit Quota Service with many streams and buckets; report reports per second.
#[derive(Debug, Parser)]
#[command(name = "sluice-quota-bench", version, about)]
struct Cli {
    #[command(flatten)]
    args: sluice_tools::quota_bench::QuotaBenchArgs,
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
    match runtime.block_on(sluice_tools::quota_bench::run(&args)) {
        Ok(report) => {
            print!("{}", if args.json { report.json() + "\n" } else { report.text() });
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
