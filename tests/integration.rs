//! Integration tests against real components: `redis-server` processes, sluice servers over TCP, the built binary.
//! One test binary; each concern in its own module.

#[macro_use]
mod harness;

mod algorithms;
mod bench_smoke;
mod chaos;
mod cli;
mod cluster;
mod contract;
mod differential;
mod exactness;
mod faults;
mod fuzz;
mod grpc;
mod http;
mod instances;
mod recovery;
mod reload;
mod semantics;
mod sentinel;
mod tls;
