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
    sluice_tools::print_outcome(async {
        let report = sluice_tools::quota_bench::run(&args).await?;
        Ok(if args.json { report.json() + "\n" } else { report.text() })
    })
}
