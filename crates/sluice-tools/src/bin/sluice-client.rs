//! `sluice-client`: one call to a running sluice from the shell (see [`sluice_tools::client`]).

use std::process::ExitCode;

use clap::Parser;

/// Call a running sluice once (ShouldRateLimit, GetRemaining, Release, the cost-budget calls, a list's entries or
/// the top offenders) and print the answer; exits 2 when the answer is OVER_LIMIT.
#[derive(Debug, Parser)]
#[command(name = "sluice-client", version, about)]
struct Cli {
    #[command(flatten)]
    args: sluice_tools::client::ClientArgs,
}

fn main() -> ExitCode {
    sluice_tools::client::main(Cli::parse().args)
}
