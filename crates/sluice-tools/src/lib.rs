//! Tools around a running sluice, speaking to it only through its gRPC API (the service crate's generated
//! protobuf types):
//!
//! - [`bench`]: `sluice-bench`, a load generator that drives either API over real gRPC connections and reports
//!   throughput, checked answers and latency percentiles.
//! - [`client`]: `sluice-client`, one call from the shell.
//! - [`budget_bench`]: `sluice-budget-bench`, Reserve+Settle pairs per second from many concurrent callers.
//! - [`quota_bench`]: `sluice-quota-bench`, many RLQS streams and buckets reporting usage as fast as answered.

#![forbid(unsafe_code)]

pub mod bench;
pub mod budget_bench;
pub mod client;
pub mod quota_bench;

use sluice::{json, proto};
