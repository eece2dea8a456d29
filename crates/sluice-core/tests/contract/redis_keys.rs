//! Where Redis keeps its counts: a lone window is counted in the window of the server's clock, not the one sluice
//! guessed, a descriptor's counting limits share its packed state, and a descriptor whose keys fail is counted whole
//! or not at all.

use sluice_core::rules::Algorithm;

use sluice_core::store::{CounterKey, Counters, Hit, Mode, ReservationSpec, Reservations, Settled, Settlement};

use super::{MINUTE, apply, hit, one};
use crate::harness::{RedisServer, T0, redis_store, tier};

/// `h` with its tiers' keys those of the descriptor `k=<name>`.
fn named(mut h: Hit, name: &str) -> Hit {
    for t in &mut h.tiers {
        let id = CounterKey::builder("test:", "d").entry("k", name).finish();
        t.key = id.tier(t.algorithm, t.window_us);
    }
    h
}

/// Decided by the server's clock, a lone fixed window's key is built by sluice for its own time; when the server's
/// time is in another window (the clocks straddle an edge), the script counts in the server's window, not the one
/// sluice guessed.
#[tokio::test]
async fn redis_a_window_guessed_across_an_edge_is_counted_in_the_servers() {
    let redis = RedisServer::start();
    let h = one("guess", Algorithm::FixedWindow, 6, MINUTE, 1);
    let now: u64 = {
        let t = redis.cli(&["--raw", "TIME"]);
        let parts: Vec<u64> = t.lines().map(|l| l.trim().parse().unwrap()).collect();
        parts[0] * 1_000_000 + parts[1]
    };
    let guess = now - 5 * MINUTE;
    let guessed = h.tiers[0].key.window(guess - guess % MINUTE);
    let script = sluice_core::store::redis::SCRIPT;
    let minute = MINUTE.to_string();
    let guess_arg = guess.to_string();
    // One descriptor, declared: its key, n = 1, the timing (the guess), then the window and the cost counted.
    let answer = redis.cli(&[
        "--raw",
        "EVAL",
        script,
        "1",
        guessed.as_str(),
        "1",
        &guess_arg,
        &minute,
        "1",
    ]);
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines[0].trim(), "0", "the count before the hit: {answer}");
    let server_now: u64 = lines[1].trim().parse().unwrap();
    assert!(server_now >= now, "the call's time is the server's: {answer}");
    let server = h.tiers[0].key.window(server_now - server_now % MINUTE);
    assert_eq!(redis.cli(&["--raw", "GET", server.as_str()]).trim(), "1");
    assert_eq!(redis.cli(&["--raw", "EXISTS", guessed.as_str()]).trim(), "0");
}

/// A descriptor's counting limits share one key, its packed state: several windows are counted whole or not at all. A
/// packed state of the wrong type fails its descriptor with nothing written, and a keyed limit of the wrong type beside
/// the windows fails it before the windows are written; the next descriptor of the call is decided all the same.
#[tokio::test]
async fn redis_windows_are_counted_whole_or_not_at_all() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let windows = |name: &str| {
        let mut h = hit(
            vec![
                tier(name, Algorithm::FixedWindow, 5, MINUTE, 5),
                tier(name, Algorithm::FixedWindow, 50, 60 * MINUTE, 50),
                tier(name, Algorithm::FixedWindow, 500, 24 * 60 * MINUTE, 500),
            ],
            1,
        );
        h.fields.clear();
        h.lease.clear();
        h
    };
    let (bad, good) = (windows("w-bad"), windows("w-good"));
    assert!(apply(&store, T0, &bad).await.admitted);
    let state = bad.tiers[0].key.packed();
    assert_eq!(redis.snapshot().len(), 1, "one key for the three windows");
    let count = |h: &Hit, i: usize| redis.record(&h.tiers[i].key).map(|r| r[2]);
    assert_eq!(
        (count(&bad, 0), count(&bad, 1), count(&bad, 2)),
        (Some(1), Some(1), Some(1))
    );
    let ttl: i64 = redis.cli(&["--raw", "PTTL", state.as_str()]).trim().parse().unwrap();
    assert!(ttl > 86_000_000, "it lives as long as its longest window: {ttl}");
    redis.cli(&["RENAME", state.as_str(), "kept"]);
    redis.cli(&["LPUSH", state.as_str(), "not a state"]);
    let answers = store.hit(T0, &[bad.clone(), good.clone()]).await;
    assert!(answers[0].is_err(), "{:?}", answers[0]);
    assert!(answers[1].as_ref().is_ok_and(|o| o.admitted), "{:?}", answers[1]);
    assert_eq!(
        redis.cli(&["--raw", "LLEN", state.as_str()]).trim(),
        "1",
        "nothing written"
    );
    redis.cli(&["DEL", state.as_str()]);
    redis.cli(&["RENAME", "kept", state.as_str()]);
    // A sliding log beside the windows, its key of the wrong type: the hit fails before the windows are written.
    let mut mixed = windows("w-bad");
    mixed.tiers.push(tier("w-bad", Algorithm::SlidingLog, 5, MINUTE, 5));
    let log = mixed.tiers[3].key.clone();
    redis.cli(&["SET", log.as_str(), "not a log"]);
    assert!(store.hit(T0, std::slice::from_ref(&mixed)).await[0].is_err());
    assert_eq!(count(&bad, 0), Some(1), "nothing counted");
    redis.cli(&["DEL", log.as_str()]);
    assert!(apply(&store, T0, &mixed).await.admitted);
    assert_eq!((count(&bad, 0), count(&bad, 2)), (Some(2), Some(2)));
}

/// A reservation and a settlement on several windows are whole or nothing: a record key of another type is replaced
/// by the reservation's record (a text); a packed state of the wrong type fails the settlement with the record kept,
/// so that the settlement, once the state is mended, applies whole.
#[tokio::test]
async fn redis_reservations_on_windows_are_whole_or_not_at_all() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let id = CounterKey::builder("test:", "d").entry("k", "budget").finish();
    let mut h = hit(
        vec![
            tier("budget", Algorithm::FixedWindow, 100, MINUTE, 100),
            tier("budget", Algorithm::FixedWindow, 1000, 60 * MINUTE, 1000),
        ],
        10,
    );
    h.fields.clear();
    h.lease.clear();
    let reserve = |rid: &str| Hit {
        mode: Mode::Reserve(ReservationSpec {
            key: id.reservation(rid),
            ttl_us: MINUTE,
        }),
        ..h.clone()
    };
    let counts = || {
        let count = |i: usize| redis.record(&h.tiers[i].key).map_or(0, |r| r[2]);
        (count(0), count(1))
    };
    let get = |key: &CounterKey| redis.cli(&["--raw", "GET", key.as_str()]).trim().to_string();
    redis.cli(&["LPUSH", id.reservation("bad").as_str(), "not a record"]);
    assert!(apply(&store, T0, &reserve("bad")).await.admitted);
    assert_eq!(get(&id.reservation("bad")), format!("{T0} {} 10,10", T0 + MINUTE));
    assert_eq!(counts(), (10, 10));
    assert!(apply(&store, T0, &reserve("r")).await.admitted);
    assert_eq!(counts(), (20, 20));
    let settlement = Settlement {
        tiers: h.tiers.clone(),
        cost: 4,
        reservation: id.reservation("r"),
        reap: false,
    };
    let state = h.tiers[0].key.packed();
    redis.cli(&["RENAME", state.as_str(), "kept"]);
    redis.cli(&["LPUSH", state.as_str(), "not a state"]);
    assert!(store.settle(T0, std::slice::from_ref(&settlement)).await[0].is_err());
    let record = id.reservation("r");
    assert_eq!(
        redis.cli(&["--raw", "EXISTS", record.as_str()]).trim(),
        "1",
        "the record kept"
    );
    redis.cli(&["DEL", state.as_str()]);
    redis.cli(&["RENAME", "kept", state.as_str()]);
    match store.settle(T0, &[settlement]).await.remove(0) {
        Ok(Settled::Done { tiers, outcome }) => {
            assert_eq!((tiers[0].refunded, tiers[1].refunded), (6, 6));
            assert_eq!((outcome.tiers[0].used, outcome.tiers[1].used), (14, 14));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(counts(), (14, 14));
    assert_eq!(redis.cli(&["--raw", "EXISTS", record.as_str()]).trim(), "0");
}

/// A lone sliding window keeps its two counts in one record of its packed state: the window before weighs as it
/// leaves, a hit with no room writes nothing, the record lives as long as its current count weighs, and a packed state
/// of the wrong type fails the hit with nothing counted while another descriptor of the call is decided all the same.
#[tokio::test]
async fn redis_a_lone_sliding_window_keeps_one_record() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    let start = T0 - T0 % MINUTE;
    let mut h = one("sw-record", Algorithm::SlidingWindow, 3, MINUTE, 1);
    h.fields.clear();
    h.lease.clear();
    let key = h.tiers[0].key.clone();
    // Six in the window before, five sixths of it still weighing: no room for a hit of a limit of 3.
    redis.set_record(&key, [start + 2 * MINUTE, start - MINUTE, 6, 0], 60_000);
    let o = apply(&store, T0, &h).await;
    assert_eq!((o.admitted, o.tiers[0].used), (false, 6), "five weighing, and the hit");
    assert_eq!(
        redis.record(&key),
        Some([start + 2 * MINUTE, start - MINUTE, 6, 0]),
        "nothing written"
    );
    // With the window before gone, two hits fit; then it weighs again, and the third writes nothing.
    redis.cli(&["DEL", key.packed().as_str()]);
    for used in 1..=2 {
        assert_eq!(apply(&store, T0, &h).await.tiers[0].used, used);
    }
    assert_eq!(redis.record(&key), Some([start + 2 * MINUTE, start, 2, 0]));
    let ttl: i64 = redis
        .cli(&["--raw", "PTTL", key.packed().as_str()])
        .trim()
        .parse()
        .unwrap();
    assert!(
        ttl > 110_000 && ttl <= 111_000,
        "read as the previous window all through the next: {ttl}"
    );
    redis.set_record(&key, [start + 2 * MINUTE, start, 2, 2], 60_000);
    assert!(!apply(&store, T0, &h).await.admitted);
    assert_eq!(redis.record(&key).map(|r| r[2]), Some(2), "nothing counted");
    // A packed state of the wrong type: an error, and the other descriptor decided.
    redis.cli(&["DEL", key.packed().as_str()]);
    redis.cli(&["LPUSH", key.packed().as_str(), "not a state"]);
    let other = one("sw-record-other", Algorithm::SlidingWindow, 3, MINUTE, 1);
    let answers = store.hit(T0, &[h.clone(), other]).await;
    assert!(answers[0].is_err(), "{:?}", answers[0]);
    assert_eq!(answers[1].as_ref().map(|o| o.tiers[0].used).ok(), Some(1));
}

/// A lone token bucket keeps its arrival time in one record, kept until the bucket is full again rounded up to the
/// next multiple of the time a full bucket takes to refill: hits that leave the arrival time within that span write
/// the state with the key's expiry kept, and the hit that takes it past moves the expiry one span on.
#[tokio::test]
async fn redis_a_buckets_hits_keep_its_keys_expiry_within_a_refill() {
    let redis = RedisServer::start();
    let store = redis_store(&redis.url()).await;
    // 60 a minute with a burst of 60: a token a second, a full refill in a minute.
    let h = one("tb-record", Algorithm::TokenBucket, 60, MINUTE, 1);
    let (key, second) = (h.tiers[0].key.clone(), MINUTE / 60);
    let pttl = || -> i64 {
        let ttl = redis.cli(&["--raw", "PTTL", h.tiers[0].key.packed().as_str()]);
        ttl.trim().parse().unwrap()
    };
    let span_end = T0 - T0 % MINUTE + MINUTE;
    assert!(apply(&store, T0, &h).await.admitted);
    assert_eq!(redis.record(&key), Some([span_end, T0 + second, 0, 0]));
    let first = pttl();
    assert!(
        first > 0 && first <= ((span_end - T0 + second) / 1000) as i64,
        "{first}"
    );
    let within = (span_end - T0) / second - 1;
    for _ in 1..within {
        assert!(apply(&store, T0, &h).await.admitted);
    }
    assert_eq!(redis.record(&key), Some([span_end, T0 + within * second, 0, 0]));
    assert!(pttl() <= first, "the key's expiry is kept: {first}, then {}", pttl());
    assert!(apply(&store, T0, &h).await.admitted);
    assert_eq!(
        redis.record(&key),
        Some([span_end + MINUTE, span_end, 0, 0]),
        "the arrival time reached the span's end"
    );
    assert!(pttl() > first, "the key's expiry moved: {first}, then {}", pttl());
}

/// Decided by the server's clock, descriptors in a row that share their arguments travel as one run (lone fixed
/// windows as 'f' in the decision script's declared form, others as '*'): each is answered in its place, a key of the
/// wrong type among them fails that one alone, and those after it are counted on their own keys.
#[tokio::test]
async fn redis_descriptors_in_a_run_are_each_answered_in_their_place() {
    let redis = RedisServer::start();
    let store = sluice_core::store::redis::RedisStore::connect(&sluice_core::store::redis::RedisSettings {
        url: redis.url(),
        timeout: std::time::Duration::from_secs(2),
        pool_size: 1,
        server_time: true,
        tls: Default::default(),
    })
    .await
    .unwrap();
    let now: u64 = {
        let t = redis.cli(&["--raw", "TIME"]);
        let parts: Vec<u64> = t.lines().map(|l| l.trim().parse().unwrap()).collect();
        parts[0] * 1_000_000 + parts[1]
    };
    // A lone fixed window, a lone sliding window, and two fixed windows on one descriptor.
    for form in ["fixed", "sliding", "windows"] {
        let make = |name: &str, cost: u64| {
            let name = format!("{form}-{name}");
            let mut h = match form {
                "fixed" => one(&name, Algorithm::FixedWindow, 10, 60 * MINUTE, cost),
                "sliding" => one(&name, Algorithm::SlidingWindow, 10, 60 * MINUTE, cost),
                _ => named(
                    hit(
                        vec![
                            tier(&name, Algorithm::FixedWindow, 10, 60 * MINUTE, 10),
                            tier(&name, Algorithm::FixedWindow, 100, 120 * MINUTE, 100),
                        ],
                        cost,
                    ),
                    &name,
                ),
            };
            h.fields.clear();
            h.lease.clear();
            h
        };
        let bad = make("bad", 1);
        // A lone fixed window's count is its window's key; the others', a record of the packed state.
        let hour = |h: &Hit| h.tiers[0].key.window(now - now % (60 * MINUTE));
        let spoiled = if form == "fixed" {
            hour(&bad)
        } else {
            bad.tiers[0].key.packed()
        };
        redis.cli(&["LPUSH", spoiled.as_str(), "not a count"]);
        let count = |h: &Hit| match form {
            "fixed" => redis
                .cli(&["--raw", "GET", hour(h).as_str()])
                .trim()
                .parse()
                .unwrap_or(0),
            _ => redis.record(&h.tiers[0].key).map_or(0, |r| r[2]),
        };
        let hits = [
            make("a", 1),
            make("b", 1),
            bad,
            make("c", 1),
            make("d", 2),
            make("a", 1),
        ];
        for round in 1..=2u64 {
            let answers = store.hit(now, &hits).await;
            let used: Vec<Option<u64>> = answers
                .iter()
                .map(|a| a.as_ref().ok().map(|o| o.tiers[0].used))
                .collect();
            assert_eq!(
                used,
                [
                    Some(2 * round - 1),
                    Some(round),
                    None,
                    Some(round),
                    Some(2 * round),
                    Some(2 * round)
                ],
                "{form}, round {round}"
            );
        }
        assert_eq!(count(&hits[0]), 4, "{form}");
        assert_eq!(count(&hits[4]), 4, "{form}");
    }
}
