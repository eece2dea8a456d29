//! In a Redis Cluster, where each script call goes, and what happens when a slot has moved.
//!
//! The descriptors of a request are grouped by the primary that serves their slots in the current slot map, and each
//! group joins that primary's shared script call (its [`Batches`](super::gather::Batches), in the node form): the
//! descriptors of concurrent requests that live on one primary, whatever their slots, are one EVALSHA, one round trip,
//! as they are against one server. Every group of a request is queued before any answer is awaited, so primaries work
//! on one request concurrently.
//!
//! A slot that moves is met in two ways, and neither can count a descriptor twice. A descriptor whose slot its node
//! no longer serves, or is migrating, is refused by the script's probe before anything of it is written (it answers
//! 0, see `lua/batch.lua`), while the other descriptors of the call are decided; and a whole call the node refused
//! before running it (MOVED, ASK, TRYAGAIN, CROSSSLOT, READONLY) decided none of its descriptors. Either way those
//! descriptors are sent again, each alone to its slot ([`to_slot`]) while the slot map is read again: to the primary
//! the map names, with declared keys, so that Redis itself redirects with MOVED or ASK before running anything, and
//! such a redirection is followed once. A call is never sent again after it may have run: one that timed out or lost
//! its connection fails.

use std::time::{Duration, Instant};

use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::call::{Call, Form, eval};
use super::cluster::{Cluster, Node};
use super::reply::{Reply, is_tryagain, redirection, refused_by_topology, unserved};
use super::script::DecisionScript;

/// One descriptor's answer, or the error that stopped it with the node that gave it (where a NOSCRIPT reloads).
pub(super) type Answer = Result<Reply, (FredError, Option<Node>)>;

/// The calls one primary takes in its node's shared call: its node, the calls' indexes, the calls.
type Group = (Node, Vec<usize>, Vec<Call>);

/// The first pause before a call that met TRYAGAIN is tried again; each pause doubles the last.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(1);

/// Decides `count` descriptors, the `i`th built by `make(i)`: each group that one primary serves in one of its
/// node's shared calls, the others (a slot without a known primary, keys without a hash tag) alone to their slots,
/// and those a node did not decide (see the module's documentation) alone to their slots after. One answer per
/// descriptor, in order.
pub(super) async fn by_node(
    cluster: &Cluster,
    script: &DecisionScript,
    timeout: Duration,
    count: usize,
    make: impl Fn(usize) -> Call,
) -> Vec<Answer> {
    let make = &make;
    let (mut groups, alone) = group(cluster, count, make);
    let batched = futures::future::join_all(
        groups
            .iter_mut()
            .map(|(node, _, calls)| node.batches.send(std::mem::take(calls))),
    );
    let lone = futures::future::join_all(
        alone
            .iter()
            .map(|&i| to_slot(cluster, script, timeout, move || make(i))),
    );
    let (batched, lone) = futures::join!(batched, lone);

    let mut answers: Vec<Option<Answer>> = (0..count).map(|_| None).collect();
    for (i, answer) in alone.into_iter().zip(lone) {
        answers[i] = Some(answer);
    }
    let mut again: Vec<usize> = Vec::new();
    for ((node, items, _), answer) in groups.into_iter().zip(batched) {
        match answer {
            Ok(values) => {
                for (i, value) in items.into_iter().zip(values) {
                    if unserved(&value) {
                        again.push(i);
                    } else {
                        answers[i] = Some(Ok(value));
                    }
                }
            }
            Err(e) if refused_by_topology(&e) => again.extend(items),
            Err(e) => {
                if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::IO) {
                    cluster.refresh_soon();
                }
                for i in items {
                    answers[i] = Some(Err((e.clone(), Some(node.clone()))));
                }
            }
        }
    }
    if !again.is_empty() {
        cluster.refresh_soon();
        cluster.count_resent(again.len());
        let resent = futures::future::join_all(
            again
                .iter()
                .map(|&i| to_slot(cluster, script, timeout, move || make(i))),
        )
        .await;
        for (i, answer) in again.into_iter().zip(resent) {
            answers[i] = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err((FredError::new(ErrorKind::Parse, "unexpected script answer"), None))))
        .collect()
}

/// The calls `make(i)` for `i` in `0..count` grouped by the primary whose node's shared call takes them (each group
/// with the calls' indexes), and the indexes of those that go alone to their slots.
fn group(cluster: &Cluster, count: usize, make: impl Fn(usize) -> Call) -> (Vec<Group>, Vec<usize>) {
    let mut groups: Vec<Group> = Vec::new();
    let mut alone: Vec<usize> = Vec::new();
    for i in 0..count {
        let mut call = make(i);
        let node = call.slot.and_then(|slot| cluster.owner(slot));
        match node {
            Some(node) if call.probe() => match groups.iter_mut().find(|(n, ..)| n.addr == node.addr) {
                Some((_, items, calls)) => {
                    items.push(i);
                    calls.push(call);
                }
                None => groups.push((node, vec![i], vec![call])),
            },
            _ => alone.push(i),
        }
    }
    (groups, alone)
}

/// One descriptor's call (built by `make`) alone to the primary of its slot, with declared keys, and the node that
/// answered. MOVED and ASK (the call ran nothing) are followed once, to the node they name; MOVED, a slot without a
/// primary and a node that failed to answer ask for a new slot map. TRYAGAIN (a call of several keys while a
/// migration has split its slot's keys between two nodes; it ran nothing) is tried again from the slot's primary,
/// after pauses that double from [`FIRST_RETRY_PAUSE`], while the store's `timeout` has not passed.
pub(super) async fn to_slot(
    cluster: &Cluster,
    script: &DecisionScript,
    timeout: Duration,
    make: impl Fn() -> Call,
) -> Answer {
    again_on_tryagain(timeout, || to_slot_once(cluster, script, timeout, &make), |(e, _)| e).await
}

/// Runs `attempt` again after TRYAGAIN (the call ran nothing), after pauses that double from [`FIRST_RETRY_PAUSE`],
/// while `timeout` has not passed since the first attempt.
async fn again_on_tryagain<T, E, F: Future<Output = Result<T, E>>>(
    timeout: Duration,
    attempt: impl Fn() -> F,
    error: impl Fn(&E) -> &FredError,
) -> Result<T, E> {
    let started = Instant::now();
    let mut pause = FIRST_RETRY_PAUSE;
    loop {
        let answer = attempt().await;
        match &answer {
            Err(e) if is_tryagain(error(e)) && started.elapsed() + pause < timeout => {
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            _ => return answer,
        }
    }
}

/// One command (`verb`, `args`: a single key's, or a script's on keys of one slot) to the primary of `slot`, as
/// [`to_slot`] sends a descriptor: MOVED and ASK (it ran nothing) are followed once, to the node they name; MOVED, a
/// slot without a primary and a node that failed to answer ask for a new slot map; TRYAGAIN is tried again while
/// the store's `timeout` has not passed.
pub(super) async fn command_to_slot(
    cluster: &Cluster,
    timeout: Duration,
    slot: u16,
    verb: &'static str,
    args: Vec<Value>,
) -> Result<Value, FredError> {
    let once = || async {
        let Some(node) = cluster.owner_within(slot, timeout).await else {
            cluster.refresh_soon();
            return Err(FredError::new(
                ErrorKind::Cluster,
                format!("no primary serves cluster slot {slot} yet"),
            ));
        };
        let command = || CustomCommand::new_static(verb, ClusterHash::Custom(slot), false);
        let e = match node.pool.next().custom(command(), args.clone()).await {
            Ok(answer) => return Ok(answer),
            Err(e) => e,
        };
        let Some((asking, target)) = redirected(cluster, timeout, &e).await else {
            return Err(e);
        };
        let client = target.pool.next();
        if !asking {
            return client.custom(command(), args.clone()).await;
        }
        // After ASK the command must follow ASKING on the same connection: a pipeline writes both together.
        let pipeline = client.pipeline();
        let asking = CustomCommand::new_static("ASKING", ClusterHash::Custom(slot), false);
        let _: () = pipeline.custom(asking, Vec::<Value>::new()).await?;
        let _: () = pipeline.custom(command(), args.clone()).await?;
        let (_, answer): (Value, Value) = pipeline.all().await?;
        Ok(answer)
    };
    again_on_tryagain(timeout, once, |e| e).await
}

/// [`to_slot`]'s call, and the redirection it may follow.
async fn to_slot_once(
    cluster: &Cluster,
    script: &DecisionScript,
    timeout: Duration,
    make: &impl Fn() -> Call,
) -> Answer {
    let call = make();
    let slot = call.slot.unwrap_or(0);
    let Some(node) = cluster.owner_within(slot, timeout).await else {
        let e = FredError::new(ErrorKind::Cluster, format!("no primary serves cluster slot {slot} yet"));
        return Err((e, None));
    };
    let first = eval(node.pool.next(), script, vec![call], Form::Declared, false).await;
    let e = match first {
        Ok(mut values) => return Ok(values.pop().unwrap_or(Reply::Script(Value::Null))),
        Err(e) => e,
    };
    let Some((asking, target)) = redirected(cluster, timeout, &e).await else {
        return Err((e, Some(node)));
    };
    eval(target.pool.next(), script, vec![make()], Form::Declared, asking)
        .await
        .map(|mut values| values.pop().unwrap_or(Reply::Script(Value::Null)))
        .map_err(|e| (e, Some(target)))
}

/// Where a call refused with `e` goes next: after MOVED or ASK (it ran nothing), the node named and whether the call
/// must follow ASKING there; `None` for any other error, which is the call's answer. A redirection, a timeout and a
/// broken connection ask for a new slot map. A node met first here (a slot moving to a new primary) is connected
/// before the call is sent again, within `timeout`, so that the call's own timeout is not spent on the connection's
/// setup.
async fn redirected(cluster: &Cluster, timeout: Duration, e: &FredError) -> Option<(bool, Node)> {
    let redirect = redirection(e);
    if redirect.is_some() || matches!(e.kind(), ErrorKind::Timeout | ErrorKind::IO) {
        cluster.refresh_soon();
    }
    let (asking, addr) = redirect?;
    let target = cluster.node(&addr)?;
    let _ = tokio::time::timeout(timeout, target.pool.wait_for_connect()).await;
    Some((asking, target))
}
