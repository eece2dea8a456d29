//! Real components for sluice's tests, by what they start: `redis-server` processes on free ports ([`redis`]: one
//! server, and a proxy that can hold its replies back), a Redis Cluster ([`cluster`]), a primary with a replica and
//! a Sentinel ([`sentinel`]), TLS Redis and a throwaway CA ([`tls`]), a network link that can be slowed or cut
//! ([`link`]); and the decision core over them ([`core`]). Every process is killed by its PID when its
//! handle is dropped. Shared by the core's, the service's and the tools' tests.

pub mod cluster;
pub mod core;
pub mod harness;
pub mod link;
pub mod redis;
pub mod sentinel;
pub mod tls;

pub use cluster::{RedisCluster, failover, keys, migrate, node_id, own_slots, rebalance, replica_of, reshard, setslot};
pub use core::{counter_of, decided, limiter_over, memory, redis_store, redis_store_with, rules, tier};
pub use harness::*;
pub use link::Link;
pub use redis::{COUNTERS_SCRIPT, RedisProcess, RedisServer, ReplyGate, record_name, signal, stored_counts};
pub use sentinel::{RedisSentinel, SENTINEL_REDIS_PASSWORD};
pub use tls::{Pem, TestCa, redis_tls_server, write_file};
