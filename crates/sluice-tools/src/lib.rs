//! Tools around a running sluice, speaking to it only through its gRPC API (the service crate's generated
//! protobuf types):
//!
//! - [`bench`](mod@bench): `sluice-bench`, a load generator that drives either API over real gRPC connections and reports
//!   throughput, checked answers and latency percentiles.
//! - [`client`]: `sluice-client`, one call from the shell.
//! - [`budget_bench`]: `sluice-budget-bench`, Reserve+Settle pairs per second from many concurrent callers.
//! - [`quota_bench`]: `sluice-quota-bench`, many RLQS streams and buckets reporting usage as fast as answered.

#![forbid(unsafe_code)]

pub mod bench;
pub mod budget_bench;
pub mod client;
pub mod quota_bench;

use sluice::faces::json;
use sluice::proto;

/// Runs `task` on a one-thread runtime and prints the text it returns, for the load binaries; on an error prints it
/// and exits 1.
pub fn print_outcome(task: impl std::future::Future<Output = anyhow::Result<String>>) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(task) {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
