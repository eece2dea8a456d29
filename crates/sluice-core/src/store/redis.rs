//! The Redis store: state kept by the Lua scripts in `store/lua/`, run through fred as a Redis function (FCALL) or by
//! EVALSHA (`script`).
//!
//! The decision script's files are loaded as one: `prelude.lua` (what the files share), every algorithm file
//! (`store/algorithm/*.lua`: each algorithm's state, its check, commit and refund, and its compact forms of the
//! commonest calls, `redis/compact.rs`), `ledger.lua` (RLQS grants), `decide.lua` (one descriptor against all its
//! tiers, atomically) and `batch.lua`, the entry, which decides a list of descriptors one after the other. Against one server (standalone or Sentinel) a request's
//! descriptors are one script call, one network round trip, and a task gathers the requests that wait at the same moment
//! into a shared script call (`gather`): under load, Redis parses one command and runs one script for up to
//! `MAX_BATCH` descriptors, and fred frames, writes and reads one command instead of one per
//! request. In a cluster each primary has such a task of its own, over its own connections (`cluster`): the
//! descriptors of concurrent requests that live on one primary share a script call whatever their slots (each
//! descriptor's keys share a hash tag, so a descriptor is on one slot), with the keys among the arguments, since
//! Redis refuses declared keys of several slots; the script runs there with the flag `allow-cross-slot-keys`
//! ([`CLUSTER_SCRIPT`]). A dead primary fails only its own slots' descriptors, and a descriptor whose slot has moved
//! or is migrating is refused by the script before anything of it is written and sent again alone to its slot,
//! following MOVED and ASK (`route`).
//! A script missing from the server (the function not found, or NOSCRIPT, after a restart, `FUNCTION FLUSH` or
//! `SCRIPT FLUSH`) is loaded again, once per server for all the calls that met it together (`ScriptLoads`), and only
//! the calls that failed are resent, which is safe because a call that found its script missing ran nothing. Every command is bounded by the store's timeout (fred's own, one
//! timer per command: a second timer around the call cost about 8% of sluice's CPU per decision); a failure surfaces
//! as a [`StoreError`] for the descriptors it concerns, and the others keep their decisions. An error inside one
//! descriptor's decision (a key of the wrong type) fails that descriptor alone. Settlements of reservations take the
//! same path, each a descriptor's call in the script's mode 'settle'.
//!
//! A Redis that is down, unreachable or not yet a formed cluster at start is not fatal: connections are retried in
//! the background (fred's `fail_fast` off), calls fail by the failure policy meanwhile, and `/readyz` turns ready by
//! itself once the store answers.
//!
//! fred writes each script call with a write of its own (it flushes after every script and custom command, whatever is
//! queued behind it), one more reason to send fewer, larger calls.
//!
//! Deployments, all by URL: one server (`redis://`), a Redis Cluster (`redis-cluster://h:p?node=h2:p2`; the seeds
//! lead to every node, MOVED and ASK are followed, and the slot map is read again after a failover), or a primary
//! found through Sentinel (`redis-sentinel://h:26379?sentinelServiceName=mymaster`; after a failover the next
//! connection asks the sentinels again). In a cluster a request's script calls are written to their primaries without
//! waiting for any answer, so primaries work on one request's descriptors concurrently; a cluster needs Redis 7 or
//! later (script flags). TLS is the `rediss`
//! form of each scheme, with [`RedisTls`] for a private CA or a client certificate; an ACL user and password go in
//! the URL (`rediss://user:password@host:port`), and never into logs or errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::{ClientLike, PubsubInterface};
use fred::types::config::ServerConfig;
use fred::types::{ClusterHash, CustomCommand, Value};

use super::{
    Announcements, Answers, CounterKey, Counters, Grant, Granted, Grants, Hit, Notice, Releases, Reservations, Settled,
    Settlement, StoreError, StreamReset, all_count,
};

mod call;
mod cluster;
mod compact;
mod format;
mod gather;
mod lists;
mod notices;
mod regions;
mod reply;
mod route;
mod script;
mod settings;

pub use format::{FORMAT, FormatCheck};
mod tallies;

use call::{Call, Form};
use cluster::{Cluster, Node};
use gather::Batches;
pub use notices::CHANNEL as NOTICE_CHANNEL;
use notices::Notices;
use reply::{Reply, parse, parse_granted, parse_settled};
use script::{DecisionScript, ScriptLoads};
pub use settings::{RedisSettings, RedisTls};
use settings::{build_pool, config_of};

/// The files of the decision script in order: the definitions, then `batch.lua`'s entry, `batch()`.
macro_rules! decision_files {
    () => {
        concat!(
            include_str!("lua/prelude.lua"),
            include_str!(concat!(env!("OUT_DIR"), "/algorithms.lua")),
            include_str!("lua/ledger.lua"),
            include_str!("lua/decide.lua"),
            include_str!("lua/batch.lua"),
        )
    };
}

/// The decision script's definitions: the helpers, every algorithm, the ledger, the decision loop and the batch entry,
/// which read the call's keys and arguments from the locals `KEYS` and `ARGV` declared ahead of them. Run as a Redis
/// function (`redis/script.rs`) or, as [`SCRIPT`], by EVALSHA.
pub const LIBRARY_BODY: &str = decision_files!();

/// The decision script as EVALSHA runs it against one server (standalone, or found through Sentinel): the
/// definitions, then the call of the entry, in one atomic unit. (`benches/run.sh` loads the same files in the same
/// order to time the script under `redis-benchmark`.)
pub const SCRIPT: &str = concat!("local KEYS, ARGV = KEYS, ARGV\n", decision_files!(), "return batch()\n");

/// The decision script as a Redis Cluster runs it: [`SCRIPT`] declaring the flag `allow-cross-slot-keys`, so that a
/// node's shared call may touch keys of several of its slots (`lua/batch.lua`'s node form). Declaring flags also
/// makes Redis refuse the whole call up front, rather than at its first write, when the node is out of memory or is a
/// replica (as it does every function's). Redis 7 or later.
pub const CLUSTER_SCRIPT: &str = concat!(
    "#!lua flags=allow-cross-slot-keys\n",
    "local KEYS, ARGV = KEYS, ARGV\n",
    decision_files!(),
    "return batch()\n"
);

/// State in Redis.
#[derive(Clone)]
pub struct RedisStore {
    /// The connections to one server (standalone or through Sentinel); in a cluster, to the seeds.
    pool: Pool,
    /// In a cluster: the slot map, and each node's connections and shared calls.
    cluster: Option<Arc<Cluster>>,
    /// The decision script, and whether it is called as a function or by EVALSHA.
    script: Arc<DecisionScript>,
    timeout: Duration,
    server_time: bool,
    /// Against one server (standalone, or found through Sentinel): the queue of the task that gathers the requests
    /// waiting at one moment into one script call. `None` in a cluster, where each node has its own.
    batches: Option<Batches>,
    /// Requests queued for a gathering task and not yet taken into a script call.
    waiting: Arc<AtomicUsize>,
    /// What the instances sharing this Redis tell each other.
    notices: Notices,
    /// Whether the server answered a call of the regions' scripts (`redis/regions.rs`): until then they go by EVAL,
    /// which loads them, rather than by an EVALSHA that would cost a NOSCRIPT round trip first.
    region_scripts: Arc<std::sync::atomic::AtomicBool>,
    /// The decision script's loads after a call found it missing, one at a time.
    loads: Arc<ScriptLoads>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Builds the pool and starts connecting. A Redis that is down at start is not fatal: the pool keeps
    /// reconnecting and `/readyz` says unready until it answers.
    pub async fn connect(settings: &RedisSettings) -> Result<RedisStore, StoreError> {
        // At start sluice waits for Redis no longer than one connection attempt: a Redis that is up answers well
        // within it, and one that is not must not hold the listeners back (sluice serves by its failure policy).
        RedisStore::connect_within(settings, settings.timeout.max(Duration::from_millis(500))).await
    }

    /// Builds the pool and starts connecting without waiting for any answer: the store of another region, which
    /// must never hold back this one's start (its calls are its links' shipments, each bounded by their timeout).
    /// Whether the server refuses the notices channel is not tried: a region's store hears none.
    pub async fn connect_in_background(settings: &RedisSettings) -> Result<RedisStore, StoreError> {
        RedisStore::connect_within(settings, Duration::ZERO).await
    }

    /// Builds the pool and starts connecting, waiting at most `patience` for the server (none when zero).
    async fn connect_within(settings: &RedisSettings, patience: Duration) -> Result<RedisStore, StoreError> {
        let config = config_of(settings)?;
        let timeout = settings.timeout;
        let clustered = matches!(config.server, ServerConfig::Clustered { .. });
        let pool = build_pool(config.clone(), timeout, settings.pool_size)?;
        let script = Arc::new(DecisionScript::new(clustered));
        let waiting = Arc::new(AtomicUsize::new(0));
        let notices = Notices::start(config.clone(), timeout)?;
        notices.mend(pool.clone());
        if clustered {
            let cluster = Cluster::start(
                config,
                timeout,
                settings.pool_size,
                patience,
                script.clone(),
                waiting.clone(),
            )
            .await;
            return Ok(RedisStore {
                pool,
                cluster: Some(Arc::new(cluster)),
                script,
                timeout,
                server_time: settings.server_time,
                batches: None,
                waiting,
                notices,
                region_scripts: Arc::default(),
                loads: Arc::default(),
            });
        }
        pool.connect();
        if !patience.is_zero() {
            match tokio::time::timeout(patience, pool.wait_for_connect()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "redis is not reachable yet; retrying in the background"),
                Err(_) => tracing::warn!(waited = ?patience, "redis did not answer; retrying in the background"),
            }
            // Try the notices channel: a user refused it must not be trusted to hear (its SUBSCRIBE fails unseen).
            let hello: Result<Result<Value, FredError>, _> =
                tokio::time::timeout(patience, pool.next().publish(NOTICE_CHANNEL, notices::HELLO)).await;
            if let Ok(Err(e)) = hello {
                if notices::refused(&e) {
                    notices.refuse();
                }
            }
        }
        let batches = Batches::start(pool.clone(), script.clone(), timeout, Form::Declared, waiting.clone());
        Ok(RedisStore {
            pool,
            cluster: None,
            script,
            timeout,
            server_time: settings.server_time,
            batches: Some(batches),
            waiting,
            notices,
            region_scripts: Arc::default(),
            loads: Arc::default(),
        })
    }

    /// How many requests wait for a gathering task to take them into a script call (in a cluster, summed over the
    /// nodes): the queue a Redis that answers slowly builds up.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// In a cluster, how many descriptors were sent again alone to their slots because the node their slot map
    /// named did not decide them (their slot had moved or was migrating); 0 against one server.
    pub fn resent(&self) -> u64 {
        self.cluster.as_ref().map_or(0, |c| c.resent())
    }

    /// The time argument of a call at `now_us`: empty to decide by the server's clock.
    fn now(&self, now_us: u64) -> Option<u64> {
        (!self.server_time).then_some(now_us)
    }

    /// Decides every hit, one script call for all of them against one server, one per primary in a cluster;
    /// reloads the script and resends the calls that met NOSCRIPT. Each hit gets its own answer.
    async fn run(&self, now_us: u64, hits: &[Hit]) -> Answers {
        let now = self.now(now_us);
        let routed = self.cluster.is_some();
        self.run_calls(hits, |hit| Call::new(now, hit, routed), parse).await
    }

    /// The script calls of `items` (hits or settlements, one descriptor each, built by `call`), sent as hits are:
    /// one script call for all of them against one server, one per primary in a cluster (each shared with
    /// concurrent requests); the script reloaded and the calls that met NOSCRIPT resent. Each item gets its own
    /// answer, read by `parse`.
    async fn run_calls<I: Sync, T>(
        &self,
        items: &[I],
        call: impl Fn(&I) -> Call + Sync,
        parse: impl Fn(Reply, &I) -> Result<T, StoreError>,
    ) -> Vec<Result<T, StoreError>> {
        let Some(cluster) = &self.cluster else {
            return self.run_on_server(items, call, parse).await;
        };
        // A call whose slots have no known primary fails without awaiting anything: a task that loops on such calls
        // would otherwise never give its worker thread back to the runtime, whose I/O brings the slot map that ends
        // the failures.
        tokio::task::consume_budget().await;
        let mut results: Vec<Option<Result<T, StoreError>>> = items.iter().map(|_| None).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        // The cluster's routing and the script's reload are boxed: inline, their states would make this future (held
        // in every request's future, and moved with it) some kilobytes instead of a few hundred bytes.
        for attempt in 0..2 {
            let sent = self.loads.now();
            let make = |j: usize| call(&items[pending[j]]);
            let answers = Box::pin(route::by_node(cluster, &self.script, self.timeout, pending.len(), make)).await;
            let mut missing = Vec::new();
            for (&i, answer) in pending.iter().zip(answers) {
                results[i] = Some(match answer {
                    Ok(value) => parse(value, &items[i]),
                    Err((e, node)) if attempt == 0 && self.script.is_missing(&e) => {
                        missing.push((i, node));
                        continue;
                    }
                    Err((e, _)) => Err(self.classify(e)),
                });
            }
            if missing.is_empty() {
                break;
            }
            let nodes: Vec<Option<Node>> = missing.iter().map(|(_, n)| n.clone()).collect();
            pending = missing.into_iter().map(|(i, _)| i).collect();
            if let Err(e) = Box::pin(self.load_script(sent, nodes)).await {
                for &i in &pending {
                    results[i] = Some(Err(e.clone()));
                }
                break;
            }
        }
        results.into_iter().map(|r| r.unwrap_or_else(missing_answer)).collect()
    }

    /// [`RedisStore::run_calls`] against one server, where the calls go out as one request through the gathering task
    /// and share its fate: every call is answered, or they all failed together (NOSCRIPT included, after which they
    /// all go again once the script is loaded).
    async fn run_on_server<I, T>(
        &self,
        items: &[I],
        call: impl Fn(&I) -> Call,
        parse: impl Fn(Reply, &I) -> Result<T, StoreError>,
    ) -> Vec<Result<T, StoreError>> {
        let all = |e: StoreError| items.iter().map(|_| Err(e.clone())).collect();
        let Some(batches) = &self.batches else {
            let e = FredError::new(ErrorKind::Config, "the redis store has no connections");
            return all(self.classify(e));
        };
        for attempt in 0..2 {
            let sent = self.loads.now();
            match batches.send(items.iter().map(&call).collect()).await {
                Ok(replies) => {
                    let mut replies = replies.into_iter();
                    return items
                        .iter()
                        .map(|item| replies.next().map_or_else(missing_answer, |reply| parse(reply, item)))
                        .collect();
                }
                Err(e) if attempt == 0 && self.script.is_missing(&e) => {
                    if let Err(e) = Box::pin(self.load_script(sent, Vec::new())).await {
                        return all(e);
                    }
                }
                Err(e) => return all(self.classify(e)),
            }
        }
        all(StoreError::Script("script still missing after reload".into()))
    }

    /// Loads the script where calls sent after `sent` (see [`ScriptLoads::now`]) met NOSCRIPT: on the one server, or
    /// on each cluster node named; not where a load completed since they were sent, and one load at a time.
    async fn load_script(&self, sent: u64, nodes: Vec<Option<Node>>) -> Result<(), StoreError> {
        let mut servers: Vec<(Arc<str>, Pool)> = Vec::new();
        for node in nodes.into_iter().flatten() {
            if !servers.iter().any(|(addr, _)| *addr == node.addr) {
                servers.push((node.addr, node.pool));
            }
        }
        if servers.is_empty() {
            servers.push((Arc::from(""), self.pool.clone()));
        }
        self.loads
            .load(sent, servers, |pool| async move {
                self.script.load(pool.next()).await.map_err(|e| self.classify(e))
            })
            .await
    }

    /// Sends one single-key command per key, each to the server that holds the key, all before any answer is
    /// awaited, and adds up the integer answers.
    async fn per_key(
        &self,
        command: &'static str,
        keys: &[CounterKey],
        extra: Option<&str>,
    ) -> Result<u64, StoreError> {
        let calls = keys.iter().map(|key| async move {
            let mut args = vec![Value::from(key.as_str())];
            args.extend(extra.map(Value::from));
            let n = self.send(key, command, args).await?;
            Ok::<u64, StoreError>(n.as_i64().unwrap_or(0).max(0) as u64)
        });
        futures::future::join_all(calls).await.into_iter().sum()
    }

    /// Runs one command on `key`'s server, `key` its first argument.
    async fn command(&self, key: &CounterKey, command: &'static str, args: Vec<Value>) -> Result<Value, StoreError> {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(Value::from(key.as_str()));
        all.extend(args);
        self.send(key, command, all).await
    }

    /// Runs `verb` with `args` (about `key`, or keys of its slot) on the server that holds `key`: the one server, or in
    /// a cluster the primary that serves the key's slot, following MOVED and ASK (`route::command_to_slot`).
    async fn send(&self, key: &CounterKey, verb: &'static str, args: Vec<Value>) -> Result<Value, StoreError> {
        self.send_raw(key, verb, args).await.map_err(|e| self.classify(e))
    }

    /// [`Self::send`], with Redis's own error.
    async fn send_raw(&self, key: &CounterKey, verb: &'static str, args: Vec<Value>) -> Result<Value, FredError> {
        let Some(cluster) = &self.cluster else {
            let command = CustomCommand::new_static(verb, ClusterHash::Random, false);
            return self.pool.next().custom(command, args).await;
        };
        let slot = fred::util::redis_keyslot(key.as_str().as_bytes());
        route::command_to_slot(cluster, self.timeout, slot, verb, args).await
    }
}

/// The answer of a call that got none.
fn missing_answer<T>() -> Result<T, StoreError> {
    Err(StoreError::Script("script still missing after reload".into()))
}

/// Reset's script for a `queue` stream: deletes it only when no entry waits in it, in one atomic step.
const RESET_IDLE_STREAM: &str = include_str!("lua/reset_idle_stream.lua");

/// Runs [`RESET_IDLE_STREAM`] by EVAL (a rare admin call, not worth a cached SHA) on each stream, each routed to its
/// own slot, all written before any answer is awaited.
async fn reset_idle_streams(store: &RedisStore, keys: &[CounterKey]) -> Result<StreamReset, StoreError> {
    let calls = keys.iter().map(|key| async move {
        let args = vec![
            Value::from(RESET_IDLE_STREAM),
            Value::Integer(1),
            Value::from(key.as_str()),
        ];
        let answer = store.send(key, "EVAL", args).await?;
        answer
            .as_i64()
            .ok_or_else(|| StoreError::Script(format!("reset_idle_stream.lua answered {answer:?}")))
    });
    let answers = futures::future::join_all(calls).await;
    let mut reset = StreamReset::default();
    for (key, answer) in keys.iter().zip(answers) {
        match answer? {
            n if n < 0 => reset.kept.push(key.clone()),
            n => reset.deleted += n as u64,
        }
    }
    Ok(reset)
}

/// Whether an error's `details` are about the decision script or its function (a failure to run or load it).
fn about_script(details: &str) -> bool {
    let lower = details.to_ascii_lowercase();
    lower.contains("script") || lower.contains("function")
}

impl RedisStore {
    fn classify(&self, e: FredError) -> StoreError {
        match e.kind() {
            ErrorKind::Timeout => StoreError::Timeout(self.timeout),
            ErrorKind::IO | ErrorKind::Canceled | ErrorKind::Routing | ErrorKind::Cluster | ErrorKind::Sentinel => {
                StoreError::Connection(e.details().to_string())
            }
            _ if self.script.is_missing(&e) || about_script(e.details()) => StoreError::Script(e.details().to_string()),
            _ => StoreError::Other(e.details().to_string()),
        }
    }
}

impl Counters for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn hit(&self, now_us: u64, hits: &[Hit]) -> Answers {
        if hits.is_empty() {
            return Vec::new();
        }
        self.run(now_us, hits).await
    }

    fn failure_domain(&self, hit: &Hit) -> u64 {
        let Some(cluster) = &self.cluster else { return 0 };
        let key = hit
            .tiers
            .first()
            .map(|t| &t.key)
            .or(hit.record.as_ref().map(|r| &r.key))
            .or(hit.reservation().map(|r| &r.key));
        key.map_or(0, |k| cluster.domain(fred::util::redis_keyslot(k.as_str().as_bytes())))
    }

    /// Deletes each key, and forgets each compact counter's record in its descriptor's packed state.
    async fn reset(&self, keys: &[CounterKey]) -> Result<u64, StoreError> {
        let deleted = self.per_key("DEL", keys, None).await?;
        let counters: Vec<&CounterKey> = keys.iter().filter(|k| k.is_counter()).collect();
        let routed = self.cluster.is_some();
        let forgotten = self
            .run_calls(
                &counters,
                |k| Call::forget(None, k, routed),
                |reply, _| reply::number(reply),
            )
            .await;
        forgotten.into_iter().try_fold(deleted, |n, f| Ok(n + f?))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        if let Some(cluster) = &self.cluster {
            // The message names the node that did not answer.
            return cluster
                .ping()
                .await
                .map_err(|e| StoreError::Connection(e.details().to_string()));
        }
        let _: Value = self.pool.next().ping(None).await.map_err(|e| self.classify(e))?;
        Ok(())
    }
}

impl Releases for RedisStore {
    async fn release(&self, keys: &[CounterKey], lease: &str) -> Result<u64, StoreError> {
        self.per_key("ZREM", keys, Some(lease)).await
    }

    async fn reset_idle_streams(&self, _now_us: u64, keys: &[CounterKey]) -> Result<StreamReset, StoreError> {
        reset_idle_streams(self, keys).await
    }
}

impl Reservations for RedisStore {
    async fn settle(&self, now_us: u64, settlements: &[Settlement]) -> Vec<Result<Settled, StoreError>> {
        // A settlement whose hit has a tier that does not count never reaches Redis.
        let counted: Vec<usize> = (0..settlements.len())
            .filter(|&i| all_count(&settlements[i].tiers))
            .collect();
        let mut answers: Vec<Result<Settled, StoreError>> = settlements.iter().map(|_| Ok(Settled::Unknown)).collect();
        if counted.is_empty() {
            return answers;
        }
        let now = self.now(now_us);
        let routed = self.cluster.is_some();
        let settled = self
            .run_calls(
                &counted,
                |&i| Call::settle(now, &settlements[i], routed),
                |value, &i| parse_settled(value, &settlements[i]),
            )
            .await;
        for (i, answer) in counted.into_iter().zip(settled) {
            answers[i] = answer;
        }
        answers
    }
}

impl Grants for RedisStore {
    async fn grant(&self, now_us: u64, grants: &[Grant]) -> Vec<Result<Granted, StoreError>> {
        if grants.is_empty() {
            return Vec::new();
        }
        let now = self.now(now_us);
        let routed = self.cluster.is_some();
        self.run_calls(grants, |g| Call::grant(now, g, routed), |value, _| parse_granted(value))
            .await
    }
}

impl Announcements for RedisStore {
    async fn announce(&self, notice: Notice) {
        match notice {
            Notice::Freed(keys) => self.notices.freed(&self.pool, keys),
            notice => self.notices.publish(&self.pool, &notice).await,
        }
    }

    fn notices(&self) -> tokio::sync::broadcast::Receiver<Notice> {
        self.notices.listen()
    }

    fn hearing(&self) -> bool {
        self.notices.hearing()
    }
}

/// The members and scores of a sorted-set reply WITHSCORES: RESP2 answers [value, score, …], RESP3 [[value, score],
/// …]. A score that does not parse reads as infinite.
fn scored(reply: Value) -> Vec<(String, f64)> {
    let flat: Vec<Value> = match reply {
        Value::Array(items) => items
            .into_iter()
            .flat_map(|item| match item {
                Value::Array(pair) => pair,
                other => vec![other],
            })
            .collect(),
        _ => Vec::new(),
    };
    flat.chunks_exact(2)
        .filter_map(|pair| Some((pair[0].as_string()?, pair[1].as_f64().unwrap_or(f64::INFINITY))))
        .collect()
}

/// An integer answer, 0 when it is none.
fn integer(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}

#[cfg(test)]
mod tests;
