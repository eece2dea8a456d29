//! Unit tests of a script call.

use super::*;
use crate::store::Mode;

#[test]
fn a_call_is_routed_to_the_slot_of_the_descriptor_keys() {
    use crate::store::Algorithm;
    let id = CounterKey::builder("p:", "d").entry("k", "v").finish();
    let key = id.tier(Algorithm::FixedWindow, 60_000_000);
    let hit = Hit {
        tiers: vec![crate::store::TierSpec {
            key: key.clone(),
            algorithm: Algorithm::FixedWindow,
            limit: 1,
            window_us: 60_000_000,
            burst: 0,
            cost: None,
            global: false,
        }],
        ..Hit::default()
    };
    let slot = fred::util::redis_keyslot(key.as_str().as_bytes());
    assert_eq!(slot, fred::util::redis_keyslot(id.records().as_str().as_bytes()));
    // Not the slot of the first argument (the SHA), which fred would hash by default.
    assert_eq!(Call::new(None, &hit, true).slot, Some(slot));
}

pub(in crate::store::redis) fn fixed_window_hit(id: &crate::store::Identity) -> Hit {
    use crate::store::Algorithm;
    Hit {
        tiers: vec![crate::store::TierSpec {
            key: id.tier(Algorithm::FixedWindow, 60_000_000).plain(),
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window_us: 60_000_000,
            burst: 0,
            cost: None,
            global: false,
        }],
        cost: 1,
        ..Hit::default()
    }
}

#[test]
fn a_probe_key_shares_the_slot_of_the_call_and_is_never_a_counter() {
    let id = CounterKey::builder("p:", "d").entry("k", "{v}").finish();
    // A forced hit goes through the decision loop's form, which has a probe (a compact fixed window needs none).
    let mut hit = fixed_window_hit(&id);
    hit.mode = Mode::Report;
    let mut compact = Call::new(None, &fixed_window_hit(&id), true);
    assert!(compact.probe() && compact.probe.is_none());
    let mut call = Call::new(None, &hit, true);
    assert!(call.probe());
    let probe = call.probe.as_ref().and_then(Value::as_string).unwrap_or_default();
    let key = hit.tiers[0].key.as_str();
    assert_eq!(probe, key[..=key.find('}').unwrap_or_default()]);
    assert_eq!(Some(fred::util::redis_keyslot(probe.as_bytes())), call.slot);
    assert!(
        key.starts_with(&probe) && key.len() > probe.len(),
        "a counter's identity follows its tag"
    );
    assert_ne!(probe, id.records().as_str());
    let mut untagged = Call {
        keys: vec![Value::from("plain")],
        args: Vec::new(),
        compact: None,
        width: 1,
        now_us: None,
        slot: Some(fred::util::redis_keyslot(b"plain")),
        probe: None,
    };
    assert!(
        !untagged.probe(),
        "a key without a hash tag has no probe: its call goes to its slot alone"
    );
    let other = CounterKey::builder("p:", "d").entry("k", "w").finish().records();
    call.keys.push(Value::from(other.as_str()));
    assert!(
        !call.probe(),
        "keys of two hash tags: the probe would vouch for one slot only"
    );
}

#[test]
fn a_node_batch_carries_each_descriptor_keys_after_its_probe() {
    let text = |command: &[Value]| -> Vec<String> {
        command
            .iter()
            .map(|v| {
                v.as_i64()
                    .map_or_else(|| v.as_string().unwrap_or_default(), |n| n.to_string())
            })
            .collect()
    };
    let ids: Vec<_> = ["a", "b"]
        .iter()
        .map(|v| CounterKey::builder("p:", "d").entry("k", v).finish())
        .collect();
    let calls = || {
        ids.iter()
            .map(|id| {
                let mut call = Call::new(Some(7), &fixed_window_hit(id), true);
                assert!(call.probe());
                call
            })
            .collect::<Vec<_>>()
    };
    // A compact fixed window travels in its compact form: window, cost counted, now; its key is the window's.
    let keys: Vec<String> = ids
        .iter()
        .map(|id| fixed_window_hit(id).tiers[0].key.window(0).as_str().to_string())
        .collect();
    let args = ["60000000", "1", "7"];
    let batch = text(&node(Value::from("sha"), calls(), None, timing(None)));
    let mut expected: Vec<String> = ["sha", "0", "node", "2", ""].map(String::from).to_vec();
    for key in &keys {
        expected.extend(args.map(String::from));
        expected.push(key.clone());
    }
    assert_eq!(
        batch, expected,
        "no probe: its own key's command is refused where the probe's would be"
    );
    let declared = text(&declared(Value::from("sha"), calls(), None, timing(None)));
    // Declared, descriptors in a row with the same arguments go as one run: '*', their number, the arguments once.
    let mut expected: Vec<String> = vec![
        "sha".into(),
        "2".into(),
        keys[0].clone(),
        keys[1].clone(),
        "1".into(),
        "".into(),
        "*".into(),
        "2".into(),
    ];
    expected.extend(args.map(String::from));
    assert_eq!(declared, expected);
    // Decided by the server's clock, lone fixed windows in a row that share their window and cost go as one run.
    let served = |v: &str| {
        let id = CounterKey::builder("p:", "d").entry("k", v).finish();
        Call::new(None, &fixed_window_hit(&id), false)
    };
    let mut denied = fixed_window_hit(&ids[0]);
    denied.cost = 2;
    let runs = vec![
        served("a"),
        served("b"),
        served("c"),
        Call::new(None, &denied, false),
        served("d"),
    ];
    let batch = text(&super::declared(Value::from("sha"), runs, Some(0), timing(Some(0))));
    assert_eq!(
        batch[7..],
        ["3", "0", "f", "3", "60000000", "1", "60000000", "2", "60000000", "1"].map(String::from),
        "three in a run, then two lone ones: {batch:?}"
    );
    // The decision loop's form: its arguments and its time, then in a node's batch its probe and its keys.
    let mut reserve = fixed_window_hit(&ids[0]);
    reserve.mode = Mode::Report;
    let mut call = Call::new(Some(7), &reserve, true);
    assert!(call.probe());
    let forced = text(&super::node(Value::from("sha"), vec![call], None, timing(None)));
    assert_eq!(
        forced[5..],
        ["report", "1", "counter", "60000000", "10", "1", "7"]
            .map(String::from)
            .into_iter()
            .chain([probes_of(&keys[0]), keys[0].clone()])
            .collect::<Vec<_>>()
    );
}

/// Calls in a row whose arguments are all the same go as one run, '*', their number and the arguments once, whatever
/// their form; the keys stay one call's after the other.
#[test]
fn calls_in_a_row_with_the_same_arguments_go_as_one_run() {
    use crate::store::Algorithm;
    let hit = |v: &str, algorithm: Algorithm, cost: u64| {
        let id = CounterKey::builder("p:", "d").entry("k", v).finish();
        let mut h = fixed_window_hit(&id);
        h.tiers[0].algorithm = algorithm;
        h.tiers[0].burst = 10;
        h.tiers[0].key = id.tier(algorithm, 60_000_000);
        h.cost = cost;
        Call::new(None, &h, false)
    };
    let calls = vec![
        hit("a", Algorithm::SlidingLog, 1),
        hit("b", Algorithm::SlidingLog, 1),
        hit("c", Algorithm::SlidingLog, 1),
        hit("d", Algorithm::SlidingLog, 2),
        hit("e", Algorithm::BucketedWindow, 1),
        hit("f", Algorithm::BucketedWindow, 1),
    ];
    let batch: Vec<String> = super::declared(Value::from("sha"), calls, Some(0), timing(Some(0)))
        .iter()
        .map(|v| {
            v.as_i64()
                .map_or_else(|| v.as_string().unwrap_or_default(), |n| n.to_string())
        })
        .collect();
    // One key each.
    assert_eq!(batch[1], "6");
    assert_eq!(
        batch[8..],
        [
            "3",
            "0",
            "*",
            "3",
            "hit",
            "1",
            "sliding_log",
            "60000000",
            "10",
            "1",
            "hit",
            "1",
            "sliding_log",
            "60000000",
            "10",
            "2",
            "*",
            "2",
            "hit",
            "1",
            "bucketed_window",
            "60000000",
            "10",
            "1",
            "10"
        ]
        .map(String::from),
        "{batch:?}"
    );
}

/// An expected argument: `@<i>` stands for the record tag of tier i (`CounterKey::record`).
fn tagged(tiers: &[crate::store::TierSpec], a: &str) -> String {
    match a.strip_prefix('@').and_then(|i| i.parse::<usize>().ok()) {
        Some(i) => tiers[i].key.record().to_string(),
        None => a.to_string(),
    }
}

fn probes_of(key: &str) -> String {
    key[..key.find('}').unwrap_or(0) + 1].to_string()
}

#[test]
fn a_reservation_travels_only_with_a_hit_on_counting_tiers() {
    use crate::store::Algorithm;
    use crate::store::{ReservationSpec, TierSpec};
    let id = CounterKey::builder("p:", "d").entry("k", "v").finish();
    let tier = |algorithm| TierSpec {
        key: id.tier(algorithm, 60_000_000),
        algorithm,
        limit: 1,
        window_us: 60_000_000,
        burst: 1,
        cost: None,
        global: false,
    };
    // A token bucket: fixed windows alone take the compact form (below).
    let hit = Hit {
        tiers: vec![tier(Algorithm::TokenBucket)],
        cost: 1,
        mode: Mode::Reserve(ReservationSpec {
            key: id.reservation("r"),
            ttl_us: u64::MAX,
        }),
        ..Hit::default()
    };
    let mode = |call: &Call| call.args[0].as_string();
    let reserve = Call::new(None, &hit, true);
    assert_eq!((reserve.keys.len(), mode(&reserve).as_deref()), (2, Some("reserve")));
    assert_eq!(
        reserve.args.last().and_then(Value::as_i64),
        Some(1 << 48),
        "the TTL, bounded"
    );
    let forced = Call::new(
        None,
        &Hit {
            mode: Mode::of(true, hit.reservation().cloned()),
            ..hit.clone()
        },
        true,
    );
    assert_eq!(mode(&forced).as_deref(), Some("reserve_report"));
    let peek = Call::new(
        None,
        &Hit {
            mode: Mode::Peek,
            ..hit.clone()
        },
        true,
    );
    assert_eq!((peek.keys.len(), mode(&peek).as_deref()), (1, Some("peek")));
    let mut mixed = hit.clone();
    mixed.tiers.push(tier(Algorithm::Concurrency));
    let mixed = Call::new(None, &mixed, true);
    assert_eq!(
        (mixed.keys.len(), mode(&mixed).as_deref()),
        (2, Some("hit+l")),
        "a concurrency limit: its lease follows"
    );
    let settle = Call::settle(
        None,
        &Settlement {
            tiers: hit.tiers.clone(),
            cost: hit.cost,
            reservation: id.reservation("r"),
            reap: false,
        },
        true,
    );
    assert_eq!((settle.keys.len(), mode(&settle).as_deref()), (2, Some("settle")));
    assert_eq!(
        settle.args.len(),
        2 + 6,
        "the head, the tier count, the tier (with its record's tag): no lease, no TTL"
    );
    assert_eq!(settle.slot, reserve.slot);
    let alone = Call::settle(
        None,
        &Settlement {
            tiers: Vec::new(),
            cost: 0,
            reservation: id.reservation("r"),
            reap: false,
        },
        true,
    );
    assert_eq!(alone.slot, reserve.slot, "routed by the record when there is no tier");
}

#[test]
fn reservations_and_settlements_go_through_the_decision_loop() {
    use crate::store::Algorithm;
    use crate::store::{ReservationSpec, TierSpec};
    let id = CounterKey::builder("p:", "d").entry("k", "v").finish();
    let tier = |algorithm, window_us| TierSpec {
        key: id.tier(algorithm, window_us),
        algorithm,
        limit: 10,
        window_us,
        burst: 10,
        cost: None,
        global: false,
    };
    let reservation = ReservationSpec {
        key: id.reservation("r"),
        ttl_us: u64::MAX,
    };
    let hit = Hit {
        tiers: vec![
            tier(Algorithm::FixedWindow, 1_000_000),
            tier(Algorithm::FixedWindow, 60_000_000),
        ],
        cost: 99,
        mode: Mode::Reserve(reservation.clone()),
        ..Hit::default()
    };
    let text = |v: &[Value]| {
        v.iter()
            .map(|v| {
                v.as_i64()
                    .map_or_else(|| v.as_string().unwrap_or_default(), |n| n.to_string())
            })
            .collect::<Vec<_>>()
    };
    let call = Call::new(Some(7_500_000), &hit, false);
    assert!(call.compact.is_none());
    let keys = text(&call.keys);
    assert_eq!(keys.len(), 2, "the packed state and the record");
    assert_eq!(keys, [hit.tiers[0].key.packed().as_str(), reservation.key.as_str()]);
    // Each window's window, limit and cost bounded by its limit + 1, the record's TTL bounded, the time; the answer
    // is the flags and each window's count.
    let expected = [
        "reserve",
        "2",
        "fixed_window",
        "1000000",
        "10",
        "11",
        "@0",
        "fixed_window",
        "60000000",
        "10",
        "11",
        "@1",
        "281474976710656",
        "7500000",
    ];
    assert_eq!(
        (text(&call.args), call.width),
        (expected.map(|a| tagged(&hit.tiers, a)).to_vec(), 3)
    );
    let settlement = Settlement {
        tiers: hit.tiers.clone(),
        cost: 3,
        reservation: reservation.key.clone(),
        reap: false,
    };
    let call = Call::settle(Some(7_500_000), &settlement, false);
    let expected = [
        "settle",
        "2",
        "fixed_window",
        "1000000",
        "10",
        "3",
        "@0",
        "fixed_window",
        "60000000",
        "10",
        "3",
        "@1",
        "7500000",
    ];
    // Whether the record was found, each window's estimate, actual, charge and refund, then a peek's answer.
    assert_eq!(
        (text(&call.args), call.width),
        (expected.map(|a| tagged(&hit.tiers, a)).to_vec(), 1 + 8 + 3)
    );
}

#[test]
fn each_tier_sends_its_own_bounded_cost() {
    use crate::store::Algorithm;
    use crate::store::TierSpec;
    let id = CounterKey::builder("p:", "d").entry("k", "v").finish();
    let tier = |algorithm, limit, cost| TierSpec {
        key: id.tier(algorithm, 60_000_000),
        algorithm,
        limit,
        window_us: 60_000_000,
        burst: 5,
        cost,
        global: false,
    };
    let hit = Hit {
        tiers: vec![
            tier(Algorithm::FixedWindow, 3, None),
            tier(Algorithm::SlidingWindow, 1_000, None),
            tier(Algorithm::TokenBucket, 1_000, Some(u64::MAX)),
            tier(Algorithm::LeakyBucket, 1_000, Some(0)),
        ],
        cost: u64::MAX,
        ..Hit::default()
    };
    let call = Call::new(Some(1), &hit, true);
    let arg = |v: &Value| {
        v.as_i64()
            .map_or_else(|| v.as_string().unwrap_or_default(), |n| n.to_string())
    };
    let args: Vec<String> = call.args.iter().map(arg).collect();
    assert_eq!(
        args,
        [
            "hit",
            "4",
            "fixed_window",
            "60000000",
            "3",
            "4",
            "@0",
            "sliding_window",
            "60000000",
            "1000",
            "1001",
            "@1",
            "token_bucket",
            "60000000",
            "1000",
            "6",
            "@2",
            "5",
            "leaky_bucket",
            "60000000",
            "1000",
            "0",
            "@3",
            "5",
            "1"
        ]
        .map(|a| tagged(&hit.tiers, a)),
        "each cost bounded by its tier's capacity + 1; a bucket's burst after it; the time last"
    );
}

#[test]
fn the_timing_header_is_the_time_the_keys_were_built_for() {
    let text = |v: Value| v.as_string().unwrap_or_default();
    assert_eq!(text(timing(None)), "");
    assert_eq!(text(timing(Some(7))), "7");
}
