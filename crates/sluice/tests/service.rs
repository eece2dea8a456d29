//! The service's tests through its faces: gRPC, HTTP, the built binary, TLS, Redis deployments and their faults.
//! One binary, a module per concern.

mod harness;

mod budget;
mod chaos;
mod cli;
mod cluster;
mod compat;
mod exposition;
mod faults;
mod fuzz;
mod grpc;
mod http;
mod lists;
mod recovery;
mod regions;
mod reload;
mod rlqs;
mod sentinel;
mod simulate;
mod tls;
