//! One script call: each descriptor's keys and arguments as `lua/batch.lua` reads them, the EVALSHA that carries
//! them in either of the script's forms (declared keys, after ASKING when a cluster said ASK; or a cluster node's
//! batch, whose keys span slots), and the reading of the answers and of Redis's errors.

use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::compact::Compact;
use super::reply::Reply;
use super::script::DecisionScript;
use crate::store::algorithm::seen_width;
use crate::store::{Algorithm, CounterKey, Grant, Hit, MAX_LEDGER_AMOUNT, RecordSpec, Settlement, TierSpec, WindowRef};

mod coalesce;
use coalesce::coalesce;

/// The decision loop's mode (`lua/decide.lua`'s head): what the script does with one descriptor.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ScriptMode {
    /// Apply the hit.
    Hit,
    /// Report only, and return the hit records.
    Peek,
    /// A forced hit: every tier counts it whether it fits or not.
    Report,
    /// A hit that also writes its reservation's record when counted.
    Reserve,
    /// A forced hit that also writes its reservation's record.
    ReserveReport,
    /// Settle a reservation with the actual costs.
    Settle,
    /// Settle an expired reservation at its estimates.
    Reap,
    /// Grant from an RLQS bucket's quota.
    Grant,
    /// Forget one counting limit's record in its descriptor's packed state (a reset of that limit).
    Forget,
    /// Read one window's count in a counting limit's record (a global window's own count, for the other regions).
    Count,
}

impl ScriptMode {
    /// The name the script knows the mode by.
    fn as_str(self) -> &'static str {
        match self {
            ScriptMode::Hit => "hit",
            ScriptMode::Peek => "peek",
            ScriptMode::Report => "report",
            ScriptMode::Reserve => "reserve",
            ScriptMode::ReserveReport => "reserve_report",
            ScriptMode::Settle => "settle",
            ScriptMode::Reap => "reap",
            ScriptMode::Grant => "grant",
            ScriptMode::Forget => "forget",
            ScriptMode::Count => "count",
        }
    }
}

/// How a script call carries its descriptors' keys (`lua/batch.lua`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Form {
    /// Declared as the command's keys: against one server, or one cluster slot (Redis refuses declared keys of
    /// several slots before running anything).
    Declared,
    /// Among the arguments, each descriptor headed by its probe key: a cluster node's batch, whose descriptors live
    /// on several of its slots. A descriptor whose slot the node does not serve in a stable state answers 0 (see
    /// [`unserved`]), nothing of it written.
    Node,
}

/// One descriptor's part of a script call (`lua/batch.lua`): its keys, and its arguments headed by their counts.
pub(super) struct Call {
    keys: Vec<Value>,
    args: Vec<Value>,
    /// The call's compact form (`store/redis/compact.rs`): what sluice needs to decide from the integers it gets.
    compact: Option<Compact>,
    /// How many places its answer takes among the script's answers (`lua/batch.lua`).
    width: usize,
    /// The decision's time, or `None` for the server's clock.
    now_us: Option<u64>,
    /// The cluster slot of its keys, which share one hash tag; `None` when it is not routed (against one server,
    /// where working it out cost more than anything else in building the call).
    pub(super) slot: Option<u16>,
    /// In a cluster node's batch: the key that tells whether the node serves the call's slot (see [`Call::probe`]).
    probe: Option<Value>,
}

impl Call {
    /// One descriptor's keys and arguments (see `lua/decide.lua`); `now_us` is `None` to decide by the server's clock,
    /// `routed` whether the call goes to a cluster (its slot is then worked out).
    pub(super) fn new(now_us: Option<u64>, hit: &Hit, routed: bool) -> Call {
        let peek = hit.peeks();
        let record = hit.record.as_ref().filter(|r| peek || r.value.is_some());
        // A peek never writes a reservation; nor does a hit whose tiers cannot hold one.
        let reservation = hit.reserves().filter(|_| !peek);
        let mode = match (peek, reservation.is_some(), hit.forced()) {
            (true, _, _) => ScriptMode::Peek,
            (false, false, true) => ScriptMode::Report,
            (false, false, false) => ScriptMode::Hit,
            (false, true, true) => ScriptMode::ReserveReport,
            (false, true, false) => ScriptMode::Reserve,
        };
        // At most MAX_RESERVATION_TTL_US: exact in the script's doubles.
        let reservation = reservation.map(|r| (&r.key, vec![Value::Integer(r.bounded_ttl_us() as i64)]));
        Call::build(
            mode,
            now_us,
            (&hit.tiers, hit.cost),
            Some((hit, record)),
            reservation,
            routed,
        )
    }

    /// One settlement's keys and arguments: decide.lua's mode 'settle', with the record as the last key.
    pub(super) fn settle(now_us: Option<u64>, settlement: &Settlement, routed: bool) -> Call {
        Call::build(
            if settlement.reap {
                ScriptMode::Reap
            } else {
                ScriptMode::Settle
            },
            now_us,
            (&settlement.tiers, settlement.cost),
            None,
            Some((&settlement.reservation, Vec::new())),
            routed,
        )
    }

    /// One grant's keys and arguments: decide.lua's mode 'grant', its tiers read at cost 0, with the ledger as the
    /// last key and the holder's entry, the streams connected if it is a newcomer (else 0) and a rate's limit (-1: a budget) after the tiers.
    pub(super) fn grant(now_us: Option<u64>, grant: &Grant, routed: bool) -> Call {
        let amount = |n: u64| Value::Integer(n.min(MAX_LEDGER_AMOUNT) as i64);
        let tail = vec![
            Value::from(grant.holder.as_str()),
            amount(grant.held),
            amount(grant.want),
            amount(grant.ttl_us),
            grant
                .newcomer
                .map_or(Value::Integer(0), |streams| amount(streams.max(1))),
            grant.rate.map_or(Value::Integer(-1), amount),
        ];
        Call::build(
            ScriptMode::Grant,
            now_us,
            (&grant.tiers, 0),
            None,
            Some((&grant.ledger, tail)),
            routed,
        )
    }

    /// A reset of the counter `key` in its descriptor's packed state: decide.lua's mode 'forget', no tiers, the packed
    /// state as the last key and the counter's record tag after the tiers.
    pub(super) fn forget(now_us: Option<u64>, key: &CounterKey, routed: bool) -> Call {
        let tail = vec![Value::Integer(key.record() as i64)];
        Call::build(
            ScriptMode::Forget,
            now_us,
            (&[], 0),
            None,
            Some((&key.packed(), tail)),
            routed,
        )
    }

    /// A read of the count of `window` in its counter's record: decide.lua's mode 'count', no tiers, the packed state
    /// as the last key and the record's tag, the window's start and its length after the tiers.
    pub(super) fn count(now_us: Option<u64>, window: &WindowRef, routed: bool) -> Call {
        let int = |n: u64| Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
        let tail = vec![int(window.key.record()), int(window.start_us), int(window.window_us)];
        Call::build(
            ScriptMode::Count,
            now_us,
            (&[], 0),
            None,
            Some((&window.key.packed(), tail)),
            routed,
        )
    }

    /// The call in `mode` on `tiers`, with `cost` the cost of every tier without its own; `hit`: for a hit or a peek,
    /// the hit (its lease, its queue fields, its reservation) and the hit records to keep or read; `extra`: the key
    /// after the tiers' (a reservation's record, a grant's ledger), and the arguments after theirs (the record's TTL
    /// when the mode writes it, a grant's entry).
    fn build(
        mode: ScriptMode,
        now_us: Option<u64>,
        (tiers, cost): (&[TierSpec], u64),
        hit: Option<(&Hit, Option<&RecordSpec>)>,
        extra: Option<(&CounterKey, Vec<Value>)>,
        routed: bool,
    ) -> Call {
        let record = hit.and_then(|(_, record)| record);
        let lease = hit.map_or("", |(h, _)| h.lease.as_str());
        // A settlement and a grant carry no queue fields: their tiers all count.
        let fields: &[(String, String)] = hit.map_or(&[], |(h, _)| &h.fields);
        let slot = tiers
            .first()
            .map(|t| &t.key)
            .or(record.map(|r| &r.key))
            .or(extra.as_ref().map(|r| r.0))
            .filter(|_| routed)
            .map(|k| fred::util::redis_keyslot(k.as_str().as_bytes()));
        // A plain counter's hit with nothing else to write has a fast form (`fixed_window.lua`'s `hit`); every other
        // call goes through the decision loop.
        if let (ScriptMode::Hit, None, [], [tier]) = (mode, record, fields, tiers)
            && plain(tier)
        {
            if let Some(compact) = Compact::of(now_us, tier, cost) {
                // Its key and arguments are written when the script call is assembled (see `Compact::parts`).
                return Call {
                    keys: Vec::new(),
                    args: Vec::new(),
                    width: 1,
                    now_us,
                    compact: Some(compact),
                    slot,
                    probe: None,
                };
            }
        }
        let mut keys: Vec<Value> = Vec::with_capacity(tiers.len() + 2);
        // The packed state first, if a tier is kept in it; then a plain counter's window and a global window's names
        // (the keys of the windows sluice's clock expects), and every other tier's own key.
        if let Some(t) = tiers.iter().find(|t| packed(t)) {
            keys.push(Value::from(String::from(t.key.packed())));
        }
        for t in tiers {
            if plain(t) || (t.global && t.algorithm.counts()) {
                let start = window_start(now_us, t.window_us);
                keys.push(Value::from(t.key.window(start).as_str()));
                if t.algorithm.windows_weighed() > 1 {
                    keys.push(Value::from(t.key.window(start.saturating_sub(t.window_us)).as_str()));
                }
            } else if !t.algorithm.counts() {
                keys.push(Value::from(t.key.as_str()));
            }
        }
        if let Some(r) = record {
            keys.push(Value::from(r.key.as_str()));
        }
        if let Some((key, _)) = &extra {
            keys.push(Value::from(key.as_str()));
        }
        let tail = extra.map(|r| r.1).unwrap_or_default();
        let peek = mode == ScriptMode::Peek;
        let width = match mode {
            ScriptMode::Grant => 6,
            ScriptMode::Forget | ScriptMode::Count => 1,
            ScriptMode::Settle | ScriptMode::Reap => 2 + tiers.iter().map(|t| 4 + seen_width(t)).sum::<usize>(),
            _ => 1 + tiers.iter().map(seen_width).sum::<usize>() + usize::from(peek && record.is_some()),
        };
        let mut args = loop_args(mode, (tiers, cost), (lease, record, fields), tail);
        args.extend(now_us.map(|now| Value::Integer(now as i64)));
        Call {
            keys,
            args,
            width,
            now_us,
            compact: None,
            slot,
            probe: None,
        }
    }

    /// Readies the call for a cluster node's batch ([`Form::Node`]): finds its probe key, the first key's prefix and
    /// hash tag alone (`<prefix>{<tag>}`), which has the slot of every key of the call and which sluice never writes
    /// (a counter's identity follows the tag). False, and the call must go to its slot alone, when its first key has
    /// no hash tag or another key does not start with the same prefix and tag (the script's probe would not vouch
    /// for its slot).
    pub(super) fn probe(&mut self) -> bool {
        if self.compact.is_some() {
            // Its own key's command is refused where a probe's read would be (see `lua/batch.lua`).
            return true;
        }
        let probe = self.keys.first().and_then(Value::as_str).and_then(|key| {
            let key = &*key;
            let open = key.find('{')?;
            let close = open + 1 + key[open + 1..].find('}')?;
            (close > open + 1).then(|| key[..=close].to_string())
        });
        let shared = |probe: &String| {
            self.keys
                .iter()
                .all(|k| k.as_str().is_some_and(|k| k.starts_with(probe.as_str())))
        };
        self.probe = probe.filter(shared).map(Value::from);
        self.probe.is_some()
    }
}

/// The decision loop's arguments (`lua/decide.lua`): the head (the mode, and '+' with a letter for each part that
/// follows the tiers: 'l' a lease, 'q' queue fields, 'k' hit records), the number of tiers, each tier's algorithm,
/// window, limit and cost (and burst, for the algorithms that have one), then those parts and `tail`. A lease goes
/// only with a tier that takes one, and queue fields with a queue.
fn loop_args(
    mode: ScriptMode,
    (tiers, hit_cost): (&[TierSpec], u64),
    (lease_id, record, fields): (&str, Option<&RecordSpec>, &[(String, String)]),
    tail: Vec<Value>,
) -> Vec<Value> {
    let lease = tiers.iter().any(|t| t.algorithm.takes_lease());
    let queue = !fields.is_empty() && tiers.iter().any(|t| t.algorithm.queues());
    let mut head = String::from(mode.as_str());
    if lease || queue || record.is_some() {
        head.push('+');
        head.extend(
            [(lease, 'l'), (queue, 'q'), (record.is_some(), 'k')]
                .into_iter()
                .filter(|p| p.0)
                .map(|p| p.1),
        );
    }
    let int = |n: u64| Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    let mut args: Vec<Value> = Vec::with_capacity(3 + 5 * tiers.len() + 2 * fields.len() + tail.len());
    args.push(Value::from(head));
    args.push(int(tiers.len() as u64));
    for t in tiers {
        args.push(Value::from(script_algorithm(t)));
        args.extend([int(t.window_us), int(t.limit), int(t.bounded_cost(hit_cost))]);
        if packed(t) {
            args.push(int(t.key.record()));
        }
        if t.algorithm.is_bucket() || t.algorithm.has_sub_windows() {
            args.push(int(t.burst));
        }
    }
    if lease {
        args.push(Value::from(lease_id));
    }
    if queue {
        args.push(int(2 * fields.len() as u64));
        for (k, v) in fields {
            args.push(Value::from(k.as_str()));
            args.push(Value::from(v.as_str()));
        }
    }
    if let Some(RecordSpec { size, value, .. }) = record {
        args.push(Value::Integer(i64::from(*size)));
        args.push(Value::from(value.as_deref().unwrap_or_default()));
    }
    args.extend(tail);
    args
}

/// This host's time in microseconds.
fn host_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The start of the window of `window_us` at `now_us`, or by this host's clock for a call decided by the server's.
fn window_start(now_us: Option<u64>, window_us: u64) -> u64 {
    let now = now_us.unwrap_or_else(host_now_us);
    now - now % window_us.max(1)
}

/// One EVALSHA deciding `calls` (`lua/batch.lua`) in `form`, routed in a cluster to the slot of the first call's
/// keys; its answer, one value per call. The slot is given explicitly: fred 10.1 honours only `ClusterHash::Custom`
/// on a custom command and otherwise hashes the first string argument, here the script's SHA. (EVALSHA is sent as a
/// custom command: fred's typed `evalsha` takes the keys and arguments apart, which this layout does not fit.)
pub(super) async fn eval(
    client: &Client,
    script: &DecisionScript,
    calls: Vec<Call>,
    form: Form,
    asking: bool,
) -> Result<Vec<Reply>, FredError> {
    let (calls, plan) = coalesce(calls);
    let widths: Vec<usize> = calls.iter().map(|c| c.width).collect();
    let places = widths.iter().sum::<usize>();
    let route = calls
        .first()
        .and_then(|c| c.slot)
        .map_or(ClusterHash::Random, ClusterHash::Custom);
    // Decided by the server's clock: the windows' keys are built for this host's time, sent along.
    let guess = calls.iter().any(|c| c.now_us.is_none()).then(host_now_us);
    let header = timing(guess);
    let nows: Vec<Option<u64>> = calls.iter().map(|c| c.now_us).collect();
    let (verb, name) = script.command();
    let command = match form {
        Form::Declared => declared(name, calls, guess, header),
        Form::Node => node(name, calls, guess, header),
    };
    let command_kind = CustomCommand::new_static(verb, route.clone(), false);
    let answer: Value = if asking {
        // After ASK the call must follow ASKING on the same connection: a pipeline writes both together.
        let pipeline = client.pipeline();
        let _: () = pipeline
            .custom(
                CustomCommand::new_static("ASKING", route.clone(), false),
                Vec::<Value>::new(),
            )
            .await?;
        let _: () = pipeline.custom(command_kind, command).await?;
        let (_, answer): (Value, Value) = pipeline.all().await?;
        answer
    } else {
        client.custom(command_kind, command).await?
    };
    let mut values = match answer {
        Value::Array(values) if values.len() == places + 1 => values,
        _ => return Err(FredError::new(ErrorKind::Parse, "unexpected script answer")),
    };
    // The server's time, when a descriptor was decided by it.
    let server_now = values.pop().and_then(|v| v.as_i64()).unwrap_or(0).max(0) as u64;
    let mut values = gather(values, &widths);
    Ok(plan
        .into_iter()
        .map(|p| match (p.own, &values[p.sent]) {
            (Some(compact), value) => compact
                .answer(value, p.ahead, compact.now_us.unwrap_or(server_now))
                .map_or_else(|| Reply::Script(value.clone()), Reply::Decided),
            (None, _) => match std::mem::replace(&mut values[p.sent], Value::Null) {
                Value::Array(items) => Reply::Seen(items, nows[p.sent].unwrap_or(server_now)),
                value => Reply::Script(value),
            },
        })
        .collect())
}

/// Each call's answer from the script's answers, where a compact form's takes `width` places: those places as one
/// array, or its first alone when that is not a count (an error, or nil: not decided here).
fn gather(values: Vec<Value>, widths: &[usize]) -> Vec<Value> {
    let mut values = values.into_iter();
    widths
        .iter()
        .map(|&width| {
            let first = values.next().unwrap_or(Value::Null);
            if width == 1 {
                return first;
            }
            let rest = values.by_ref().take(width - 1);
            if !matches!(first, Value::Integer(_)) {
                rest.for_each(drop);
                return first;
            }
            Value::Array(std::iter::once(first).chain(rest).collect())
        })
        .collect()
}

/// The header argument that says how compact fixed windows are timed: `guess`, this host's time the keys were built
/// for, when they are decided by the server's clock; '' when each carries its time.
fn timing(guess: Option<u64>) -> Value {
    match guess {
        Some(g) => Value::Integer(g as i64),
        None => Value::from(""),
    }
}

/// EVALSHA's arguments in the declared form: every call's keys, then n, the timing header, then every call's
/// arguments, where lone fixed windows in a row that share their window and cost (decided by the server's clock) go
/// as one run, 'f', their number, the window and the cost, and other calls in a row whose arguments are the same
/// as one run too, '*', their number, and the arguments once; n counts each run once.
fn declared(sha: Value, mut calls: Vec<Call>, guess: Option<u64>, header: Value) -> Vec<Value> {
    let keys: usize = calls
        .iter()
        .map(|c| c.compact.as_ref().map_or(c.keys.len(), |_| 1))
        .sum();
    let args: usize = calls.iter().map(|c| c.args.len().max(3)).sum();
    let mut command = Vec::with_capacity(4 + keys + args);
    command.push(sha);
    command.push(Value::Integer(keys as i64));
    for call in &mut calls {
        match &call.compact {
            Some(compact) => compact.push_keys(guess.unwrap_or(0), &mut command),
            None => command.append(&mut call.keys),
        }
    }
    let mut args = Vec::with_capacity(args);
    let mut heads = 0;
    // The last head's arguments: where they start in `args`, and where its count is once calls share them ('*').
    let mut last: Option<(usize, Option<usize>)> = None;
    let mut calls = calls.into_iter().peekable();
    while let Some(call) = calls.next() {
        let lone = call.compact.as_ref().and_then(Compact::lone_window);
        let mut run = 1;
        while lone.is_some() && calls.peek().and_then(|c| c.compact.as_ref()?.lone_window()) == lone {
            calls.next();
            run += 1;
        }
        let from = args.len();
        match (&call.compact, lone) {
            (Some(_), Some((window, cost))) if run > 1 => {
                let int = |n: u64| Value::Integer(n as i64);
                args.extend([Value::from("f"), int(run), int(window), int(cost)]);
            }
            (Some(compact), _) => compact.push_args(&mut args),
            (None, _) => args.extend(call.args),
        }
        match last {
            Some((start, count)) if args[start..from] == args[from..] => {
                args.truncate(from);
                match count {
                    Some(at) => args[at] = Value::Integer(args[at].as_i64().unwrap_or(0) + 1),
                    None => {
                        args.splice(start..start, [Value::from("*"), Value::Integer(2)]);
                        last = Some((start + 2, Some(start + 1)));
                    }
                }
            }
            _ => {
                heads += 1;
                last = Some((from, None));
            }
        }
    }
    command.push(Value::Integer(heads));
    command.push(header);
    command.append(&mut args);
    command
}

/// EVALSHA's arguments in the node form: no keys, 'node', n, the timing header, then per call a compact form's
/// arguments and its keys, or the decision loop's arguments, its probe key ('' when it has none: the script then
/// decides nothing of it) and its keys.
fn node(sha: Value, calls: Vec<Call>, guess: Option<u64>, header: Value) -> Vec<Value> {
    let size: usize = calls.iter().map(|c| 1 + c.keys.len() + c.args.len().max(3)).sum();
    let mut command = Vec::with_capacity(5 + size);
    command.push(sha);
    command.push(Value::Integer(0));
    command.push(Value::from("node"));
    command.push(Value::Integer(calls.len() as i64));
    command.push(header);
    for call in calls {
        if let Some(compact) = &call.compact {
            compact.push_args(&mut command);
            compact.push_keys(guess.unwrap_or(0), &mut command);
            continue;
        }
        command.extend(call.args);
        command.push(call.probe.unwrap_or_else(|| Value::from("")));
        command.extend(call.keys);
    }
    command
}

/// The name the script knows a tier's algorithm by: a global window's is `global:` and its algorithm's
/// (`lua/prelude.lua`'s `global_of`).
fn script_algorithm(t: &TierSpec) -> &'static str {
    if plain(t) {
        return "counter";
    }
    match t.global.then(|| t.algorithm.global_name()).flatten() {
        Some(name) => name,
        None => t.algorithm.name(),
    }
}

/// Whether a tier is a plain counter ([`CounterKey::plain`]): a fixed window counted in this region alone, kept as an
/// integer per window (`fixed_window.lua`'s `L.counter`).
fn plain(t: &TierSpec) -> bool {
    t.key.is_plain() && t.algorithm == Algorithm::FixedWindow && !t.global
}

/// Whether a tier is kept in its descriptor's packed state (`lua/decide.lua`): every other counting limit.
fn packed(t: &TierSpec) -> bool {
    t.algorithm.counts() && !plain(t)
}

#[cfg(test)]
pub(super) mod tests;
