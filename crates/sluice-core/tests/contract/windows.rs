//! The window algorithms, one hit at a time: a fixed window counts (a lone one its denials too), a sliding window
//! weighs the window before it, and a sliding log keeps every hit's time, so its retry times are exact.

use sluice_core::rules::Algorithm;
use sluice_core::store::Store;

use super::{MINUTE, SECOND, apply, one, peek};
use crate::harness::T0;

every_store!(
    fixed_window_counts_denials_like_the_reference,
    fixed_window_cost_zero_reads_without_creating,
    sliding_window_weighs_the_previous_window,
    sliding_log_is_exact_and_retry_is_exact,
);

async fn fixed_window_counts_denials_like_the_reference(store: impl Store) {
    let now = T0 + 5 * SECOND;
    let h = one("fw", Algorithm::FixedWindow, 3, MINUTE, 1);
    for expected in 1..=3 {
        let o = apply(&store, now, &h).await;
        assert!(o.admitted);
        assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (expected, 3 - expected));
        assert_eq!(
            o.tiers[0].reset_after_us,
            MINUTE - 15 * SECOND,
            "T0 is 10 s into its minute"
        );
    }
    let o = apply(&store, now, &h).await;
    assert!(!o.admitted);
    assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (4, 0));
    let p = peek(&store, now, &h).await;
    assert_eq!(p.tiers[0].used, 4, "a lone fixed window counts its denials");
    assert_eq!(p.tiers[0].retry_after_us, Some(45 * SECOND));
    let next = T0 + MINUTE;
    let o = apply(&store, next, &h).await;
    assert!(o.admitted, "the next epoch-aligned window starts empty");
    assert_eq!(o.tiers[0].used, 1);
}

async fn fixed_window_cost_zero_reads_without_creating(store: impl Store) {
    let check = one("z", Algorithm::FixedWindow, 2, MINUTE, 0);
    let o = apply(&store, T0, &check).await;
    assert_eq!((o.admitted, o.tiers[0].used, o.tiers[0].remaining), (true, 0, 2));
    apply(&store, T0, &one("z", Algorithm::FixedWindow, 2, MINUTE, 1)).await;
    let o = apply(&store, T0, &check).await;
    assert_eq!((o.tiers[0].used, o.tiers[0].remaining), (1, 1));
    let o = apply(&store, T0, &one("zero", Algorithm::FixedWindow, 0, MINUTE, 1)).await;
    assert!(!o.admitted, "a limit of 0 rejects every hit");
}

async fn sliding_window_weighs_the_previous_window(store: impl Store) {
    let w = 10 * SECOND;
    let start = T0 - T0 % w;
    let h = one("sw", Algorithm::SlidingWindow, 10, w, 1);
    for _ in 0..10 {
        assert!(apply(&store, start + SECOND, &h).await.admitted);
    }
    let o = apply(&store, start + SECOND, &h).await;
    assert!(!o.admitted);
    // Half way through the next window half the previous window still counts: 5 places.
    let mid = start + w + 5 * SECOND;
    let p = peek(&store, mid, &h).await;
    assert_eq!(p.tiers[0].remaining, 5, "the denied hit was not counted");
    for _ in 0..5 {
        assert!(apply(&store, mid, &h).await.admitted);
    }
    assert!(!apply(&store, mid, &h).await.admitted);
    // The retry time is exact: one microsecond earlier does not fit, at it the hit fits.
    let retry = peek(&store, mid, &h).await.tiers[0].retry_after_us.unwrap();
    assert!(retry > 0);
    assert!(!peek(&store, mid + retry - 1, &h).await.admitted);
    assert!(peek(&store, mid + retry, &h).await.admitted);
}

async fn sliding_log_is_exact_and_retry_is_exact(store: impl Store) {
    let w = 10 * SECOND;
    let h = one("sl", Algorithm::SlidingLog, 3, w, 1);
    for i in 0..3 {
        assert!(apply(&store, T0 + i * SECOND, &h).await.admitted);
    }
    let o = apply(&store, T0 + 3 * SECOND, &h).await;
    assert!(!o.admitted);
    let p = peek(&store, T0 + 3 * SECOND, &h).await;
    assert_eq!(
        p.tiers[0].retry_after_us,
        Some(7 * SECOND),
        "the oldest hit (T0) leaves at T0 + 10 s"
    );
    assert_eq!(
        p.tiers[0].reset_after_us,
        9 * SECOND,
        "empty when the newest (T0 + 2 s) leaves"
    );
    assert!(!apply(&store, T0 + w - 1, &h).await.admitted);
    assert!(apply(&store, T0 + w, &h).await.admitted);
    let big = one("sl", Algorithm::SlidingLog, 3, w, 4);
    assert_eq!(peek(&store, T0 + w, &big).await.tiers[0].retry_after_us, None);
}
