//! Records: a descriptor keeps the last values its hits carried, newest first, as many as its size.

use sluice_core::rules::Algorithm;
use sluice_core::store::{CounterKey, RecordSpec, Store};

use super::{MINUTE, apply, one, peek};
use crate::harness::T0;

every_store!(records_keep_the_last_values);

async fn records_keep_the_last_values(store: impl Store) {
    let base = CounterKey::builder("test:", "d").entry("ip", "1.2.3.4").finish();
    let mut h = one("rec", Algorithm::FixedWindow, 100, MINUTE, 1);
    h.tiers[0].key = base.tier(Algorithm::FixedWindow, MINUTE);
    for user in ["u1", "u2", "u3", "u4"] {
        h.record = Some(RecordSpec {
            key: base.records(),
            size: 3,
            value: Some(user.into()),
        });
        apply(&store, T0, &h).await;
    }
    let p = peek(&store, T0, &h).await;
    assert_eq!(p.records, ["u4", "u3", "u2"]);
}
