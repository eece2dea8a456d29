//! The Redis store on a Redis Cluster of three primaries. The descriptors that live on one primary share its script
//! call whatever their slots; a descriptor of a slot that is migrating or has moved is decided once, where its
//! counter is, and never part-way; and three live reshards under load (`redis-cli --cluster reshard`) fail no
//! decision, lose no hit and count none twice; nor do a rebalance onto a newly added primary and three manual
//! failovers; a start beside a dead primary decides the live slots at once; and a task looping on calls that fail at
//! once (no node answering yet) does not keep the store from reading the slot map.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::util::redis_keyslot;
use sluice_core::rules::Algorithm;
use sluice_core::store::redis::{FormatCheck, RedisStore};
use sluice_core::store::{CounterKey, Hit, Identity, ListChange, ListEntry, Lists, RecordSpec, TierSpec};

use crate::harness::{
    COUNTERS_SCRIPT, RedisCluster, RedisProcess, T0, decided, failover, migrate, own_slots, rebalance, record_name,
    redis_cli, redis_store_with, replica_of, reshard, script_calls, setslot, signal, stored_counts,
};
use sluice_core::store::Counters;
use sluice_core::store::Mode;

const HOUR: u64 = 3_600_000_000;
const DAY: u64 = 24 * HOUR;
/// The start of a day: every window is whole, so no counter expires while a test runs.
const NOW: u64 = T0 - T0 % DAY;

fn identity(prefix: &str, i: usize) -> Identity {
    CounterKey::builder(prefix, "d").entry("k", &format!("v{i}")).finish()
}

/// The keys of a descriptor's fixed windows: a day, and an hour for a descriptor of two tiers. A lone one is a plain
/// counter, as the limiter names it.
fn tier_keys(id: &Identity, tiers: usize) -> Vec<CounterKey> {
    [DAY, HOUR][..tiers]
        .iter()
        .map(|&w| id.tier(Algorithm::FixedWindow, w))
        .map(|key| if tiers == 1 { key.plain() } else { key })
        .collect()
}

/// A hit of 1 on a descriptor's fixed windows, whose limits are never reached.
fn hit(id: &Identity, tiers: usize) -> Hit {
    let tiers = tier_keys(id, tiers)
        .into_iter()
        .zip([DAY, HOUR])
        .map(|(key, window_us)| TierSpec {
            key,
            algorithm: Algorithm::FixedWindow,
            limit: u64::from(u32::MAX),
            window_us,
            burst: 0,
            cost: None,
            global: false,
        })
        .collect();
    Hit {
        tiers,
        cost: 1,
        ..Hit::default()
    }
}

fn slot(id: &Identity) -> u16 {
    redis_keyslot(id.tier(Algorithm::FixedWindow, DAY).as_str().as_bytes())
}

fn serves(ranges: &[(u16, u16)], slot: u16) -> bool {
    ranges.iter().any(|&(a, b)| (a..=b).contains(&slot))
}

/// Each counter whose key starts with `prefix` on the node at `port`, with its count, read by one script there.
fn counters(port: u16, prefix: &str) -> HashMap<String, u64> {
    stored_counts(&redis_cli(port, &["EVAL", COUNTERS_SCRIPT, "0", &format!("{prefix}*")]))
}

/// The name [`counters`] lists a descriptor's counter `key` by: a lone window's (a plain counter's key), or its record
/// in the descriptor's packed state.
fn stored_name(key: &CounterKey, tiers: usize) -> String {
    if tiers == 1 {
        key.as_str().to_string()
    } else {
        record_name(key)
    }
}

/// How much a descriptor has used of its day, through the store.
async fn used(store: &RedisStore, id: &Identity) -> u64 {
    let mut peek = hit(id, 1);
    peek.cost = 0;
    peek.mode = Mode::Peek;
    decided(store.hit(NOW, &[peek]).await)[0].tiers[0].used
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_of_a_moving_slot_is_decided_once_where_its_counter_is() {
    let cluster = RedisCluster::start();
    let store = redis_store_with(&cluster.url(), Duration::from_secs(1)).await;
    let prefix = "moving:";
    // `a` and `e` live on one slot of `source`, `b` on another of its slots, and `c`, never hit until the slot
    // migrates, on `a`'s slot too.
    let a = identity(prefix, 0);
    let s = slot(&a);
    let source = cluster.slot_owner(s).expect("a primary serves the slot");
    let target = cluster
        .primaries()
        .into_iter()
        .find(|&p| p != source)
        .expect("another primary");
    let ranges = own_slots(source);
    let mut same_slot = (1..).map(|i| identity(prefix, i)).filter(|id| slot(id) == s);
    let (c, e) = (same_slot.next().unwrap(), same_slot.next().unwrap());
    let b = (1..)
        .map(|i| identity(prefix, i))
        .find(|id| slot(id) != s && serves(&ranges, slot(id)))
        .unwrap();

    // Two slots of one primary: one script call decides both (once the script is loaded there, and on `target`).
    let target_ranges = own_slots(target);
    let on_target = (1..)
        .map(|i| identity(prefix, i))
        .find(|id| serves(&target_ranges, slot(id)))
        .unwrap();
    assert!(
        decided(store.hit(NOW, &[hit(&b, 1), hit(&on_target, 1)]).await)
            .iter()
            .all(|o| o.admitted)
    );
    let calls = script_calls(source);
    let out = decided(store.hit(NOW, &[hit(&a, 1), hit(&b, 1), hit(&e, 1)]).await);
    assert!(out.iter().all(|o| o.admitted));
    assert_eq!(script_calls(source), calls + 1, "one call for descriptors of two slots");

    // The slot migrates from `source` to `target`: `a`'s counter is still on `source`, `c` has none yet.
    setslot(target, s, "IMPORTING", source);
    setslot(source, s, "MIGRATING", target);
    let resent = store.resent();
    let out = decided(store.hit(NOW, &[hit(&a, 1), hit(&b, 1), hit(&c, 1)]).await);
    assert!(out.iter().all(|o| o.admitted));
    // `a` and `c` are lone fixed windows, whose read of their one key is their probe: `a`'s counter is still on
    // `source`, which serves it; `c` has none there, so `source` refuses it (ASK) before writing anything.
    assert_eq!(
        store.resent(),
        resent + 1,
        "`c` was refused by `source`'s call and sent to its slot; `a` and `b` were decided in it"
    );
    let keys_in = |port: u16| {
        redis_cli(port, &["CLUSTER", "COUNTKEYSINSLOT", &s.to_string()])
            .trim()
            .to_string()
    };
    assert_eq!(
        keys_in(source),
        "2",
        "`a` and `e` still counted where their counters are"
    );
    assert_eq!(
        keys_in(target),
        "1",
        "`c` counted on the node importing the slot (after ASK)"
    );

    // A descriptor whose keys the migration has split (its day on `source`, its hit records nowhere yet) is never
    // decided part-way: Redis refuses it before anything runs (TRYAGAIN while the slot migrates), and its day
    // keeps its count.
    let mut recording = hit(&e, 1);
    recording.record = Some(RecordSpec {
        key: e.records(),
        size: 3,
        value: Some("x".into()),
    });
    let refused = store.hit(NOW, &[recording]).await;
    assert!(refused[0].is_err(), "{refused:?}");
    assert_eq!(
        used(&store, &e).await,
        1,
        "nothing of the refused descriptor was written"
    );

    // The migration ends: `a`'s counter moves, and the slot is `target`'s. The store's map may still name
    // `source`, which refuses (MOVED): `a` is counted once, on `target`.
    let a_key = hit(&a, 1).tiers[0].key.window(NOW).as_str().to_string();
    let e_key = hit(&e, 1).tiers[0].key.window(NOW).as_str().to_string();
    migrate(source, target, &[&a_key, &e_key]);
    for port in cluster.primaries() {
        setslot(port, s, "NODE", target);
    }
    let out = decided(store.hit(NOW, &[hit(&a, 1), hit(&b, 1)]).await);
    assert!(out.iter().all(|o| o.admitted));
    assert_eq!(
        (
            used(&store, &a).await,
            used(&store, &b).await,
            used(&store, &c).await,
            used(&store, &e).await
        ),
        (3, 4, 1, 1),
        "every hit counted once"
    );
    assert_eq!(redis_cli(target, &["GET", &a_key]).trim(), "3");
}

/// Instances started one after the other on a fresh cluster, each deciding at once over every slot: the first
/// records the storage format, each finds it, and no decision fails (nothing at start moves or rewrites counters).
#[tokio::test]
async fn instances_started_on_a_fresh_cluster_decide_at_once() {
    const DESCRIPTORS: usize = 300;
    let cluster = RedisCluster::start();
    let ids: Vec<Identity> = (0..DESCRIPTORS).map(|i| identity("fresh:", i)).collect();
    for start in 0..4 {
        let store = redis_store_with(&cluster.url(), Duration::from_secs(5)).await;
        assert_eq!(
            store.check_format("fresh:").await.expect("the marker's slot is served"),
            FormatCheck::Known,
            "start {start}"
        );
        let hits: Vec<Hit> = ids.iter().enumerate().map(|(i, id)| hit(id, 1 + i % 2)).collect();
        let outcomes = decided(store.hit(NOW, &hits).await);
        assert!(outcomes.iter().all(|o| o.admitted), "start {start}");
    }
    let slots: std::collections::HashSet<u16> = ids
        .iter()
        .map(|id| redis_keyslot(tier_keys(id, 1)[0].as_str().as_bytes()))
        .collect();
    assert!(slots.len() > 250, "spread over the slots: {}", slots.len());
    let days: std::collections::HashSet<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| stored_name(&tier_keys(id, 1 + i % 2)[0], 1 + i % 2))
        .collect();
    let mut total = 0;
    for port in cluster.primaries() {
        for (name, n) in counters(port, "fresh:") {
            if days.contains(&name) {
                total += n;
            }
        }
    }
    assert_eq!(total, 4 * DESCRIPTORS as u64, "every hit counted once");
}

/// A start beside a dead primary: one primary and its replica killed, so that a third of the slots has no live node.
/// The store, at a timeout of three seconds, routes the live slots as soon as a live node has named them: it starts,
/// and decides every live slot's descriptor, about as soon as on the whole cluster (waiting on no dead node's
/// timeout), while the dead slots' descriptors fail alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_beside_a_dead_primary_decides_the_live_slots_at_once() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let mut cluster = RedisCluster::start();
    let ids: Vec<Identity> = (0..300).map(|i| identity("damaged:", i)).collect();
    let hits: Vec<Hit> = ids.iter().map(|id| hit(id, 1)).collect();
    // What a start and a first decision take on the whole cluster, in this run.
    let started = Instant::now();
    let whole = redis_store_with(&cluster.url(), TIMEOUT).await;
    assert!(decided(whole.hit(NOW, &hits).await).iter().all(|o| o.admitted));
    let baseline = started.elapsed();
    drop(whole);

    let victim = cluster.primaries()[0];
    let dead = own_slots(victim);
    let nodes: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let replica = replica_of(victim, &nodes).expect("the victim has a replica");
    cluster.node(replica).kill();
    cluster.node(victim).kill();

    let (live, dead): (Vec<_>, Vec<_>) = ids.iter().zip(&hits).partition(|(id, _)| !serves(&dead, slot(id)));
    let live: Vec<Hit> = live.into_iter().map(|(_, h)| h.clone()).collect();
    let dead: Vec<Hit> = dead.into_iter().map(|(_, h)| h.clone()).collect();
    let started = Instant::now();
    let store = redis_store_with(&cluster.url(), TIMEOUT).await;
    let answers = store.hit(NOW, &live).await;
    let took = started.elapsed();
    for answer in &answers {
        assert!(
            matches!(answer, Ok(o) if o.admitted),
            "a live slot's descriptor is decided: {answer:?}"
        );
    }
    for answer in store.hit(NOW, &dead).await {
        assert!(answer.is_err(), "a dead slot's descriptor fails: {answer:?}");
    }
    let (live, failed) = (live.len(), dead.len());
    eprintln!(
        "start beside a dead primary: {live} live descriptors decided {took:?} after start ({baseline:?} on the \
         whole cluster); {failed} dead"
    );
    assert!(live > 100 && failed > 50, "{live} live, {failed} dead");
    assert!(
        took < baseline + TIMEOUT / 3,
        "decided {took:?} after start, {baseline:?} on the whole cluster: the start waited on the dead node"
    );
}

/// A store started while every node is frozen (SIGSTOP) has no slot map, so each call fails at once, awaiting
/// nothing. A task that loops on such calls, on a runtime of one thread, still lets the store read the map once the
/// nodes run again: its calls succeed within seconds, not never.
#[tokio::test]
async fn a_task_looping_on_calls_that_fail_at_once_lets_the_store_recover() {
    let cluster = RedisCluster::start();
    let pids: Vec<u32> = cluster.nodes.iter().filter_map(RedisProcess::pid).collect();
    for &pid in &pids {
        signal(pid, "STOP");
    }
    let store = redis_store_with(&cluster.url(), Duration::from_millis(200)).await;
    let hits = [hit(&identity("frozen:", 0), 1)];
    assert!(store.hit(NOW, &hits).await[0].is_err(), "no node answers yet");
    // Resumed from another thread: this one's runtime is the test's, busy with the loop below.
    let resumed = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        for pid in pids {
            signal(pid, "CONT");
        }
    });
    let (started, deadline) = (Instant::now(), Instant::now() + Duration::from_secs(30));
    let mut calls = 0u64;
    let recovered = loop {
        calls += 1;
        if store.hit(NOW, &hits).await[0].is_ok() {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
    };
    resumed.join().unwrap();
    let state = if recovered { "recovered" } else { "still failing" };
    eprintln!(
        "looping on failing calls: {state} after {:?} and {calls} calls",
        started.elapsed()
    );
    assert!(
        recovered,
        "the store read the slot map while a task looped on its failing calls"
    );
}

/// The commands sluice sends outside its decision script (a list's entries here; offenders' tallies, regions'
/// shipments, releases and the format marker go the same way) follow a moving slot: ASK while its keys migrate, and
/// MOVED once it has moved while the store's slot map still names the old primary. Every call succeeds and the
/// entries are where the slot is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_outside_the_script_follow_a_moving_slot() {
    let cluster = RedisCluster::start();
    let store = redis_store_with(&cluster.url(), Duration::from_secs(5)).await;
    let list = CounterKey::list("moving:", "d", "deny");
    let slot = redis_keyslot(list.as_str().as_bytes());
    let source = cluster.slot_owner(slot).expect("the slot has a primary");
    let target = cluster.primaries().into_iter().find(|&p| p != source).unwrap();
    let add = |value: &'static str| {
        let store = &store;
        let list = &list;
        async move {
            let values = [value.to_string()];
            let change = ListChange::Add {
                values: &values,
                expires_us: None,
                max: 100,
            };
            store.list_change(NOW, list, change).await
        }
    };
    let entries = || async { store.list_entries(NOW, &list).await };
    assert_eq!(add("a").await.unwrap(), Some(1));

    // The slot migrates, its key already moved: the source answers ASK for it.
    setslot(target, slot, "IMPORTING", source);
    setslot(source, slot, "MIGRATING", target);
    migrate(source, target, &[list.as_str()]);
    assert_eq!(add("b").await.expect("ASK is followed"), Some(1));
    let values = |found: Vec<ListEntry>| found.into_iter().map(|e| e.value).collect::<Vec<_>>();
    assert_eq!(values(entries().await.expect("ASK is followed")), ["a", "b"]);

    // The slot is the target's now; the store's map, read again only every few seconds once settled, still names
    // the source, which answers MOVED.
    for port in cluster.primaries() {
        setslot(port, slot, "NODE", target);
    }
    assert_eq!(add("c").await.expect("MOVED is followed"), Some(1));
    assert_eq!(values(entries().await.expect("MOVED is followed")), ["a", "b", "c"]);
    assert_eq!(redis_cli(target, &["ZCARD", list.as_str()]).trim(), "3");
    let left = redis_cli(source, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
    assert_eq!(left.trim(), "0");
}

/// Requests of one and of three descriptors, from many tasks at once, over descriptors of one and of two tiers on
/// every slot, while three reshards move two thousand slots each: from the first primary to the second, from the
/// second to the third, and from the first to the third. Every decision succeeds, and afterwards each counter holds
/// exactly the hits admitted on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_reshard_under_load_fails_no_decision_and_counts_every_hit_once() {
    let cluster = RedisCluster::start();
    let primaries = cluster.primaries();
    let moves = [
        (primaries[0], primaries[1]),
        (primaries[1], primaries[2]),
        (primaries[0], primaries[2]),
    ];
    moves_under_load(&cluster, "reshard:", move || {
        for (from, to) in moves {
            reshard(from, to, 2_000).map_err(|e| format!("reshard from {from} to {to}: {e}"))?;
        }
        Ok(())
    })
    .await;
}

/// The same load while a seventh node joins as a primary and the slots are spread over the four
/// (`redis-cli --cluster rebalance`): the new primary, met first when a slot moves to it, fails no decision either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_onto_a_new_primary_under_load_fails_no_decision_and_counts_every_hit_once() {
    let mut cluster = RedisCluster::start();
    let any = cluster.primaries()[0];
    let new = cluster.add_primary();
    moves_under_load(&cluster, "rebalance:", move || rebalance(any)).await;
    assert!(cluster.primaries().contains(&new), "the new primary serves slots");
}

/// The same load through three manual failovers (`CLUSTER FAILOVER` on a replica of each primary in turn): no decision
/// fails while each primary hands its slots to its replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_failovers_under_load_fail_no_decision_and_count_every_hit_once() {
    let cluster = RedisCluster::start();
    let nodes: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let replicas: Vec<u16> = cluster
        .primaries()
        .into_iter()
        .map(|p| replica_of(p, &nodes).expect("every primary has a replica"))
        .collect();
    moves_under_load(&cluster, "failover:", move || {
        replicas.into_iter().try_for_each(failover)
    })
    .await;
}

/// Decides hits from many tasks at once, with a store of five seconds' timeout, while `operate` moves slots (blocking,
/// as redis-cli does), and for as many requests after; then checks that every decision succeeded, that some
/// descriptors were sent again to their slots, and that each counter, read on the node that serves its slot, holds
/// exactly the hits admitted on it.
async fn moves_under_load(
    cluster: &RedisCluster,
    prefix: &'static str,
    operate: impl FnOnce() -> Result<(), String> + Send + 'static,
) {
    const DESCRIPTORS: usize = 1_500;
    const WORKERS: usize = 24;
    // `SLUICE_MOVES_TIMEOUT_MS` sets another timeout: `benches/cluster_ops.sh` runs these tests at the default.
    let timeout = std::env::var("SLUICE_MOVES_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis);
    let store = Arc::new(redis_store_with(&cluster.url(), timeout).await);
    let tiers = |i: usize| if i % 3 == 0 { 2 } else { 1 };
    let ids: Arc<Vec<Identity>> = Arc::new((0..DESCRIPTORS).map(|i| identity(prefix, i)).collect());
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..DESCRIPTORS).map(|_| AtomicU64::new(0)).collect());
    let (stop, requests) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (store, ids, admitted) = (store.clone(), ids.clone(), admitted.clone());
            let (stop, requests, failures) = (stop.clone(), requests.clone(), failures.clone());
            tokio::spawn(async move {
                let mut state = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(w as u64 + 1);
                let mut next = || {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    (state >> 33) as usize % DESCRIPTORS
                };
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let chosen: Vec<usize> = (0..if round % 2 == 0 { 3 } else { 1 }).map(|_| next()).collect();
                    let hits: Vec<Hit> = chosen.iter().map(|&i| hit(&ids[i], tiers(i))).collect();
                    for (&i, answer) in chosen.iter().zip(store.hit(NOW, &hits).await) {
                        match answer {
                            Ok(o) if o.admitted => {
                                admitted[i].fetch_add(1, Ordering::Relaxed);
                            }
                            other => failures.lock().unwrap().push(format!("descriptor {i}: {other:?}")),
                        }
                    }
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let until = |count: u64| {
        let requests = requests.clone();
        async move {
            while requests.load(Ordering::Relaxed) < count {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };

    until(500).await;
    let nodes: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let slot_map = |nodes: &[u16]| -> Vec<Vec<(u16, u16)>> { nodes.iter().map(|&p| own_slots(p)).collect() };
    let before = slot_map(&nodes);
    let started = (Instant::now(), requests.load(Ordering::Relaxed));
    let operated = tokio::task::spawn_blocking(operate).await.unwrap();
    let during = requests.load(Ordering::Relaxed) - started.1;
    let took = started.0.elapsed();
    // Requests after the moves, while the store's slot map may still name the old owners.
    until(requests.load(Ordering::Relaxed) + 500).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    assert!(operated.is_ok(), "{operated:?}");
    let failures = failures.lock().unwrap().clone();
    let total = requests.load(Ordering::Relaxed);
    eprintln!(
        "{prefix} {during} requests during the moves ({took:?}), {total} in all; {} descriptors sent again to their \
         slots; {} failed",
        store.resent(),
        failures.len()
    );
    assert!(during > 100, "the load ran while the slots moved: {during} requests");
    assert!(
        failures.is_empty(),
        "{} failed decisions: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        store.resent() > 0,
        "descriptors of moved slots were refused by their old node and sent again"
    );

    // Every counter, read on the node that holds it, counts exactly the hits admitted on it.
    let after = slot_map(&nodes);
    let mut found: HashMap<String, (u64, u16)> = HashMap::new();
    for port in cluster.primaries() {
        let ranges = own_slots(port);
        for (key, n) in counters(port, prefix) {
            assert!(
                serves(&ranges, redis_keyslot(key.as_bytes())),
                "{key} on {port}, which does not serve its slot"
            );
            found.insert(key, (n, port));
        }
    }
    let (mut moved, mut expected_keys) = (0, 0);
    for (i, id) in ids.iter().enumerate() {
        let hits = admitted[i].load(Ordering::Relaxed);
        for key in tier_keys(id, tiers(i)) {
            let name = stored_name(&key, tiers(i));
            let n = found.get(&name).map(|(n, _)| *n);
            assert_eq!(n.unwrap_or(0), hits, "descriptor {i}: {name}");
            expected_keys += usize::from(hits > 0);
        }
        let s = slot(id);
        let owner = |map: &[Vec<(u16, u16)>]| map.iter().position(|r| serves(r, s));
        moved += usize::from(hits > 0 && owner(&before) != owner(&after));
    }
    assert_eq!(found.len(), expected_keys, "no counter beyond the descriptors'");
    assert!(moved > 0, "counters moved with their slots: {moved}");
}
