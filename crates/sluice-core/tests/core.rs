//! The core's tests against real `redis-server` processes and the in-memory store: one binary, a module per
//! concern.

#[macro_use]
mod harness;

mod algorithms;
mod bucketed;
mod budget;
mod cache;
mod cluster;
mod contract;
mod differential;
mod embedded;
mod exactness;
mod instances;
mod layout;
mod ledger;
mod lists;
mod offenders;
mod quota;
mod reference;
mod regions;
mod semantics;
mod shares;
mod wait;
