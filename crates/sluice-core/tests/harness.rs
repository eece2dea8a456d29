//! The core's test harness: the real components of `sluice-testkit`, limiters whose metrics go nowhere, and macros
//! that run one behaviour over every store.

use std::sync::Arc;

use sluice_core::clock::ManualClock;
use sluice_core::limiter::{Limiter, LimiterSettings};
use sluice_core::metrics::Metrics;
use sluice_core::store::Store;

pub use sluice_testkit::*;

/// Instantiates each named `async fn name(store: impl Store)` of the calling module twice: once over the
/// in-memory store, once over a fresh `redis-server`.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory_store {
            $(#[tokio::test] async fn $name() { super::$name(crate::harness::memory()).await; })*
        }
        mod redis_store {
            $(#[tokio::test] async fn $name() {
                let redis = crate::harness::RedisServer::start();
                super::$name(crate::harness::redis_store(&redis.url()).await).await;
            })*
        }
    };
}

/// [`both_stores!`], and once more over a fresh `redis-server` reached as the documented least-privilege ACL user, so
/// that the documented ACL cannot miss a command the store or its scripts use.
macro_rules! every_store {
    ($($name:ident),* $(,)?) => {
        both_stores!($($name),*);
        mod redis_acl_user {
            $(#[tokio::test] async fn $name() {
                let redis = crate::harness::RedisServer::start();
                let url = redis.acl_user_url();
                super::$name(crate::harness::redis_store(&url).await).await;
            })*
        }
    };
}

/// A limiter over `store` with a manual clock at [`T0`].
pub fn limiter<S: Store>(yaml: &str, store: S) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    limiter_with(yaml, store, LimiterSettings::default())
}

pub fn limiter_with<S: Store>(yaml: &str, store: S, settings: LimiterSettings) -> (Arc<Limiter<S>>, Arc<ManualClock>) {
    limiter_over(yaml, store, settings, Metrics::discarded(0.8))
}
