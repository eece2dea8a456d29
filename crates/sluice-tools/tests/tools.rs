//! The tools against in-process sluice servers: the load generator's counts and checks, the one-shot client.

/// The service's own test harness: in-process servers on ephemeral ports.
#[path = "../../sluice/tests/harness.rs"]
#[allow(dead_code)]
mod harness;

mod bench_smoke;
mod client;
