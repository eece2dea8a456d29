//! Resets: a reset deletes exactly the keys it is given, and an idle reset keeps the queues that still hold
//! entries.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{MINUTE, apply, one, peek};
use crate::harness::T0;

every_store!(
    reset_deletes_exactly_the_given_keys,
    reset_keeps_streams_that_hold_entries,
);

async fn reset_deletes_exactly_the_given_keys(store: impl Store) {
    let a = one("ra", Algorithm::TokenBucket, 1, MINUTE, 1);
    let b = one("rb", Algorithm::TokenBucket, 1, MINUTE, 1);
    apply(&store, T0, &a).await;
    apply(&store, T0, &b).await;
    let keys = [a.tiers[0].key.clone()];
    assert_eq!(store.reset(&keys).await.unwrap(), 1);
    assert!(apply(&store, T0, &a).await.admitted, "a starts over");
    assert!(!apply(&store, T0, &b).await.admitted, "b is untouched");
}

async fn reset_keeps_streams_that_hold_entries(store: impl Store) {
    let q = one("rq", Algorithm::Queue, 2, MINUTE, 1);
    let never = one("rq-never", Algorithm::Queue, 2, MINUTE, 1);
    assert!(apply(&store, T0, &q).await.admitted);
    let keys = [q.tiers[0].key.clone(), never.tiers[0].key.clone()];
    let reset = store.reset_idle_streams(T0, &keys).await.unwrap();
    assert_eq!(
        reset.deleted, 0,
        "nothing deleted: one stream waits, the other never existed"
    );
    assert_eq!(reset.kept, [q.tiers[0].key.clone()], "the stream with an entry is kept");
    assert_eq!(
        peek(&store, T0, &q).await.tiers[0].remaining,
        1,
        "its entry still waits"
    );
    assert_eq!(store.reset(&keys[..1]).await.unwrap(), 1, "a plain reset drops it");
    assert_eq!(peek(&store, T0, &q).await.tiers[0].remaining, 2);
}
