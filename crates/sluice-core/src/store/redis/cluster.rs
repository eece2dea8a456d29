//! Redis Cluster routing with one client per node, so that a node's trouble stays that node's.
//!
//! fred's clustered client holds every command while it reconnects to any node, so one dead primary stopped the
//! decisions of every slot until its replica took over. Here each node has a plain (centralized) connection pool of
//! its own, and its own task gathering the calls for it into shared script calls ([`Batches`] in the node form), and
//! sluice keeps the slot map itself: a call goes to the primary that owns its slot, a dead primary fails only the
//! calls for its slots, and the calls for the others go on.
//!
//! The slot map is read with `CLUSTER SLOTS` from every known node at once (the seeds of the URL, then every node the
//! answers name), and the answer most nodes give wins, a complete one (all 16384 slots served) before any other, and
//! one that serves fewer slots than the map in use only if two nodes give it (see [`pick`]); an answer that serves
//! more slots than the map in use (at start, or while slots are uncovered) is used at once, so that a node that does
//! not answer (a dead primary, answered for only by the timeout) holds back no slot of the others. It is read again
//! every [`UNSETTLED_REFRESH`] while it is incomplete (a cluster still being created, or being repaired) or one of its
//! primaries does not answer (a failover under way), every [`SETTLED_REFRESH`] otherwise, and at once when a call
//! meets MOVED, a slot without a primary, or a node that does not answer. Until a first read has ended, a call for a
//! slot without a primary waits for it ([`Cluster::owner_within`]). What a call does then is `route`'s.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use fred::clients::Pool;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::{Config, Server, ServerConfig};
use fred::types::{ClusterHash, CustomCommand, Value};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;

use super::call::Form;
use super::gather::Batches;
use super::script::DecisionScript;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;
/// How often a complete slot map is read again when nothing asked for it sooner.
const SETTLED_REFRESH: Duration = Duration::from_secs(5);
/// How often an incomplete slot map (or none) is read again.
const UNSETTLED_REFRESH: Duration = Duration::from_millis(250);
/// The least time between two reads, however often calls ask.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);
const NO_OWNER: u16 = u16::MAX;

/// One node: its address, its failure-domain id, its connections, and the queue of its shared script calls.
#[derive(Clone)]
pub(super) struct Node {
    pub addr: Arc<str>,
    /// A hash of the address, never 0 (the domain of a store on one server).
    pub id: u64,
    pub pool: Pool,
    pub batches: Batches,
}

/// Which primary serves each slot.
struct SlotMap {
    owner: Box<[u16]>,
    primaries: Vec<Node>,
}

impl SlotMap {
    fn empty() -> SlotMap {
        SlotMap {
            owner: vec![NO_OWNER; SLOTS].into_boxed_slice(),
            primaries: Vec::new(),
        }
    }

    fn complete(&self) -> bool {
        !self.primaries.is_empty() && self.served() == SLOTS
    }

    /// How many slots have a primary.
    fn served(&self) -> usize {
        self.owner.iter().filter(|&&o| o != NO_OWNER).count()
    }
}

/// The routing state of one cluster.
pub(super) struct Cluster {
    inner: Arc<Inner>,
    /// Descriptors sent again alone to their slots after their node did not decide them (see `route`).
    resent: AtomicU64,
}

struct Inner {
    /// The URL's configuration (credentials, TLS), from which each node's is made.
    base: Config,
    seeds: Vec<Server>,
    timeout: Duration,
    pool_size: usize,
    /// The decision script's SHA1, for each node's gathering task.
    script: Arc<DecisionScript>,
    /// The store's count of requests waiting to be taken into a script call, shared by every node's task.
    waiting: Arc<AtomicUsize>,
    map: ArcSwap<SlotMap>,
    /// The map is complete and every primary in it answered the last read.
    settled: std::sync::atomic::AtomicBool,
    /// Every node with connections, by `host:port`.
    nodes: Mutex<HashMap<Arc<str>, Node>>,
    wake: Notify,
    /// How many reads of the map have ended; with `changed`, told of each end and of each map installed.
    reads: AtomicU64,
    changed: Notify,
}

impl Cluster {
    /// Starts routing for the cluster that `config` (a clustered configuration) names, waiting at most `patience` for
    /// a complete slot map or the end of a first read of it, whichever comes first; it is read in the background from
    /// then on. Each node's shared calls
    /// run `script`, and count their waiting requests in `waiting`.
    pub async fn start(
        config: Config,
        timeout: Duration,
        pool_size: usize,
        patience: Duration,
        script: Arc<DecisionScript>,
        waiting: Arc<AtomicUsize>,
    ) -> Cluster {
        let seeds = match &config.server {
            ServerConfig::Clustered { hosts, .. } => hosts.clone(),
            _ => Vec::new(),
        };
        let inner = Arc::new(Inner {
            base: config,
            seeds,
            timeout,
            pool_size: pool_size.max(1),
            script,
            waiting,
            map: ArcSwap::from_pointee(SlotMap::empty()),
            settled: std::sync::atomic::AtomicBool::new(false),
            nodes: Mutex::default(),
            wake: Notify::new(),
            reads: AtomicU64::new(0),
            changed: Notify::new(),
        });
        tokio::spawn(keep_fresh(Arc::downgrade(&inner)));
        let first_map = inner.until(|map| map.complete());
        let _ = tokio::time::timeout(patience, first_map).await;
        if !inner.map.load().complete() {
            tracing::warn!("redis cluster: the slot map is not complete yet; reading it again in the background");
        }
        Cluster {
            inner,
            resent: AtomicU64::new(0),
        }
    }

    /// The primary that serves `slot`, if the map knows one; asks for a new map if not.
    pub fn owner(&self, slot: u16) -> Option<Node> {
        let map = self.inner.map.load();
        let node = map
            .owner
            .get(usize::from(slot))
            .and_then(|&o| map.primaries.get(usize::from(o)))
            .cloned();
        if node.is_none() {
            self.refresh_soon();
        }
        node
    }

    /// The primary that serves `slot`, waiting at most `patience` for it while no read of the slot map has ended yet
    /// (a store just started, whose first read took longer than the start waited): until then a slot without a
    /// primary in the map is not known to have none. Once a read has ended, [`Cluster::owner`] at once.
    pub async fn owner_within(&self, slot: u16, patience: Duration) -> Option<Node> {
        if self.inner.reads.load(Ordering::Relaxed) == 0 {
            let known = self.inner.until(|map| map.owner[usize::from(slot)] != NO_OWNER);
            let _ = tokio::time::timeout(patience, known).await;
        }
        self.owner(slot)
    }

    /// The failure domain of `slot`: its primary's id, or one shared by every slot without a primary.
    pub fn domain(&self, slot: u16) -> u64 {
        let map = self.inner.map.load();
        map.owner
            .get(usize::from(slot))
            .and_then(|&o| map.primaries.get(usize::from(o)))
            .map_or(1, |n| n.id)
    }

    /// The node at `addr` (`host:port`, as a MOVED or ASK error names it), connecting to it if it is new.
    pub fn node(&self, addr: &str) -> Option<Node> {
        let (host, port) = addr.rsplit_once(':')?;
        let port = port.parse().ok()?;
        self.inner.node(&Server::new(host, port))
    }

    /// Counts `n` descriptors sent again alone to their slots.
    pub fn count_resent(&self, n: usize) {
        self.resent.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// How many descriptors were sent again alone to their slots since the start.
    pub fn resent(&self) -> u64 {
        self.resent.load(Ordering::Relaxed)
    }

    /// Asks the background task to read the slot map again now.
    pub fn refresh_soon(&self) {
        self.inner.wake.notify_one();
    }

    /// Whether every slot has a primary and every primary answers.
    pub async fn ping(&self) -> Result<(), FredError> {
        let map = self.inner.map.load_full();
        if !map.complete() {
            let served = map.owner.iter().filter(|&&o| o != NO_OWNER).count();
            return Err(FredError::new(
                ErrorKind::Cluster,
                format!("cluster slot map incomplete: {served} of {SLOTS} slots have a primary"),
            ));
        }
        let pings = map.primaries.iter().map(|n| async move {
            let answer: Result<Value, FredError> = n.pool.next().ping(None).await;
            answer.map_err(|e| FredError::new(e.kind().clone(), format!("primary {}: {}", n.addr, e.details())))
        });
        let answers: Result<Vec<Value>, FredError> = futures::future::join_all(pings).await.into_iter().collect();
        answers.map(|_| ()).inspect_err(|_| self.refresh_soon())
    }
}

/// When the last user of the routing state is gone (the store, and the refresh task that may have been reading the
/// map at that moment), every node's connections are closed; outside a runtime there is nothing left to close them
/// on, and they go with the process.
impl Drop for Inner {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let nodes = std::mem::take(&mut *self.nodes.lock().unwrap_or_else(|e| e.into_inner()));
        for node in nodes.into_values() {
            runtime.spawn(async move {
                let _ = node.pool.quit().await;
            });
        }
    }
}

/// Reads the slot map at once, then again whenever asked, or on a timer; ends within one wait of the cluster being
/// dropped.
async fn keep_fresh(inner: Weak<Inner>) {
    while let Some(strong) = inner.upgrade() {
        strong.refresh().await;
        strong.reads.fetch_add(1, Ordering::Relaxed);
        strong.changed.notify_waiters();
        drop(strong);
        tokio::time::sleep(MIN_REFRESH_GAP).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let wait = if strong.settled.load(Ordering::Relaxed) {
            SETTLED_REFRESH
        } else {
            UNSETTLED_REFRESH
        };
        let _ = tokio::time::timeout(wait, strong.wake.notified()).await;
        if Arc::strong_count(&strong) == 1 {
            return;
        }
    }
}

impl Inner {
    /// Waits until a read of the slot map has ended, or the map in use is `ready`.
    async fn until(&self, ready: impl Fn(&SlotMap) -> bool) {
        loop {
            // Registered before the test, so that a change between the two is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.reads.load(Ordering::Relaxed) > 0 || ready(&self.map.load()) {
                return;
            }
            changed.await;
        }
    }

    /// The connections to `server`, made on first use; `None` if fred refuses the node's configuration.
    fn node(&self, server: &Server) -> Option<Node> {
        let addr: Arc<str> = Arc::from(format!("{}:{}", server.host, server.port));
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(node) = nodes.get(&addr) {
            return Some(node.clone());
        }
        let mut server = server.clone();
        // A node named by IP in CLUSTER SLOTS is still verified against the name the URL gave.
        if server.tls_server_name.is_none() {
            server.tls_server_name = self.seeds.first().and_then(|s| s.tls_server_name.clone());
        }
        let mut config = self.base.clone();
        config.server = ServerConfig::Centralized { server };
        let pool = super::settings::build_pool(config, self.timeout, self.pool_size)
            .inspect_err(|e| tracing::warn!(node = %addr, error = %e, "redis cluster: cannot configure a node"))
            .ok()?;
        pool.connect();
        let batches = Batches::start(
            pool.clone(),
            self.script.clone(),
            self.timeout,
            Form::Node,
            self.waiting.clone(),
        );
        let node = Node {
            id: crate::store::fnv1a(addr.as_bytes()).max(2),
            addr: addr.clone(),
            pool,
            batches,
        };
        nodes.insert(addr, node.clone());
        Some(node)
    }

    /// Reads `CLUSTER SLOTS` from every known node and installs the answer most of them give, a complete one first;
    /// an answer that serves more slots than the map in use (at start, or while slots are uncovered) is installed as
    /// it comes. Records whether the
    /// cluster looks settled: the map complete, and every primary in it answering.
    async fn refresh(&self) {
        let mut asking = self.ask_slots();
        let mut answered = Vec::new();
        while let Some(answer) = asking.next().await {
            let Some(answer) = answer else { continue };
            if covers(&answer.1) > self.map.load().served() {
                self.install(self.map_of(&answer.1).0);
            }
            answered.push(answer);
        }
        let answers: Vec<Vec<Range>> = answered.iter().map(|(_, r)| r.clone()).collect();
        let Some(best) = pick(&answers, self.map.load().served()) else {
            self.settled.store(false, Ordering::Relaxed);
            return;
        };
        let (map, known) = self.map_of(best);
        self.connect_new_primaries(&map).await;
        let settled = map.complete()
            && map
                .primaries
                .iter()
                .all(|p| answered.iter().any(|(addr, _)| *addr == p.addr));
        self.settled.store(settled, Ordering::Relaxed);
        self.install(map);
        self.keep_connections(&known);
    }

    /// Every node's answer to `CLUSTER SLOTS`, asking the seeds and every node known, in the order they come (`None`:
    /// a node that did not answer).
    fn ask_slots(&self) -> FuturesUnordered<impl Future<Output = Option<(Arc<str>, Vec<Range>)>> + use<>> {
        let mut asked: Vec<Server> = self.seeds.clone();
        {
            let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            for addr in nodes.keys() {
                if let Some((host, port)) = addr.rsplit_once(':') {
                    if let Ok(port) = port.parse() {
                        let server = Server::new(host, port);
                        if !asked.contains(&server) {
                            asked.push(server);
                        }
                    }
                }
            }
        }
        asked
            .iter()
            .filter_map(|server| self.node(server).map(|n| (n, server.host.to_string())))
            .map(|(node, host)| async move {
                let command = CustomCommand::new_static("CLUSTER", ClusterHash::Random, false);
                let answer: Result<Value, FredError> = node.pool.next().custom(command, vec!["SLOTS"]).await;
                answer
                    .ok()
                    .and_then(|v| parse_slots(v, &host))
                    .map(|ranges| (node.addr, ranges))
            })
            .collect()
    }

    /// The slot map of the ranges `best`, with connections to its primaries, and every node it names (primaries and
    /// replicas).
    fn map_of(&self, best: &[Range]) -> (SlotMap, HashSet<Arc<str>>) {
        let mut map = SlotMap::empty();
        let mut index: HashMap<&str, u16> = HashMap::new();
        let mut known: HashSet<Arc<str>> = HashSet::new();
        for range in best {
            let at = match index.get(range.primary.as_str()) {
                Some(&i) => i,
                None => {
                    let Some(node) = split_addr(&range.primary).and_then(|s| self.node(&s)) else {
                        continue;
                    };
                    let i = map.primaries.len() as u16;
                    map.primaries.push(node);
                    index.insert(&range.primary, i);
                    i
                }
            };
            for slot in range.start..=range.end.min(SLOTS as u16 - 1) {
                map.owner[usize::from(slot)] = at;
            }
            known.insert(Arc::from(range.primary.as_str()));
            known.extend(range.replicas.iter().map(|r| Arc::from(r.as_str())));
        }
        (map, known)
    }

    /// Waits, at most the store's timeout, for the connections of the primaries `map` names that the map in use does
    /// not (a node a rebalance just gave its first slots): routed to only once its connections are up, it charges no
    /// call their setup against the call's own timeout. The map in use serves meanwhile (its old owners answer MOVED
    /// or ASK, which are followed).
    async fn connect_new_primaries(&self, map: &SlotMap) {
        let old = self.map.load();
        let new = map
            .primaries
            .iter()
            .filter(|p| !old.primaries.iter().any(|o| o.addr == p.addr))
            .map(|p| tokio::time::timeout(self.timeout, p.pool.wait_for_connect()));
        futures::future::join_all(new).await;
    }

    /// Installs `map`, logging when it differs from the one in use, and tells whoever waits for a map.
    fn install(&self, map: SlotMap) {
        let old = self.map.load();
        if old.owner != map.owner
            || old
                .primaries
                .iter()
                .map(|p| &p.addr)
                .ne(map.primaries.iter().map(|p| &p.addr))
        {
            let primaries: Vec<&str> = map.primaries.iter().map(|p| &*p.addr).collect();
            tracing::info!(?primaries, complete = map.complete(), "redis cluster: slot map changed");
        }
        self.map.store(Arc::new(map));
        self.changed.notify_waiters();
    }

    /// Closes the connections to nodes that are neither seeds nor `known` any more, and opens connections to every
    /// `known` node, replicas too, so that a map can still be read after their primary dies.
    fn keep_connections(&self, known: &HashSet<Arc<str>>) {
        let seeds: HashSet<String> = self.seeds.iter().map(|s| format!("{}:{}", s.host, s.port)).collect();
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<Arc<str>> = nodes
            .keys()
            .filter(|a| !known.contains(*a) && !seeds.contains(&***a))
            .cloned()
            .collect();
        for addr in gone {
            if let Some(node) = nodes.remove(&addr) {
                tokio::spawn(async move {
                    let _ = node.pool.quit().await;
                });
            }
        }
        for addr in known {
            if !nodes.contains_key(addr) {
                drop(nodes);
                if let Some(server) = split_addr(addr) {
                    let _ = self.node(&server);
                }
                nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

/// A slot range as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Range {
    start: u16,
    end: u16,
    primary: String,
    replicas: Vec<String>,
}

/// The ranges of a `CLUSTER SLOTS` answer; an empty host stands for the node that answered (`host`).
fn parse_slots(value: Value, host: &str) -> Option<Vec<Range>> {
    let Value::Array(ranges) = value else { return None };
    let node = |v: &Value| -> Option<String> {
        let Value::Array(fields) = v else { return None };
        let ip = fields.first()?.as_string()?;
        let port = fields.get(1)?.as_i64()?;
        let ip = if ip.is_empty() || ip == "?" {
            host.to_string()
        } else {
            ip
        };
        Some(format!("{ip}:{port}"))
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in &ranges {
        let Value::Array(parts) = range else { return None };
        out.push(Range {
            start: u16::try_from(parts.first()?.as_i64()?).ok()?,
            end: u16::try_from(parts.get(1)?.as_i64()?).ok()?,
            primary: node(parts.get(2)?)?,
            replicas: parts.iter().skip(3).filter_map(node).collect(),
        });
    }
    out.sort_by_key(|r| r.start);
    Some(out)
}

/// How many slots an answer serves.
fn covers(answer: &[Range]) -> usize {
    answer
        .iter()
        .map(|r| usize::from(r.end.saturating_sub(r.start)) + 1)
        .sum()
}

/// The answer most nodes gave among the complete ones, or among all when none is complete; `None` when that answer
/// serves fewer slots than `served`, the map in use, and only one node gave it: a node that has just joined knows
/// only the slots gossip has told it of, and while the others are slow to answer (a rebalance under way) its view
/// alone must not take their primaries out of the map. A loss of coverage that several nodes agree on is taken.
fn pick(answers: &[Vec<Range>], served: usize) -> Option<&Vec<Range>> {
    let complete: Vec<&Vec<Range>> = answers.iter().filter(|a| covers(a) >= SLOTS).collect();
    let pool: Vec<&Vec<Range>> = if complete.is_empty() {
        answers.iter().filter(|a| !a.is_empty()).collect()
    } else {
        complete
    };
    let mut votes: Vec<(&Vec<Range>, usize)> = Vec::new();
    for a in pool {
        match votes
            .iter_mut()
            .find(|(known, _)| known.iter().map(primary_of).eq(a.iter().map(primary_of)))
        {
            Some((_, n)) => *n += 1,
            None => votes.push((a, 1)),
        }
    }
    let (best, n) = votes.into_iter().max_by_key(|(a, n)| (*n, covers(a)))?;
    (n > 1 || covers(best) >= served).then_some(best)
}

fn primary_of(r: &Range) -> (u16, u16, &str) {
    (r.start, r.end, r.primary.as_str())
}

fn split_addr(addr: &str) -> Option<Server> {
    let (host, port) = addr.rsplit_once(':')?;
    Some(Server::new(host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(ranges: &[(u16, u16, &str)]) -> Vec<Range> {
        ranges
            .iter()
            .map(|&(start, end, primary)| Range {
                start,
                end,
                primary: primary.to_string(),
                replicas: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_lone_narrower_view_does_not_replace_the_map_but_an_agreed_one_does() {
        let whole = answer(&[(0, 8191, "a:1"), (8192, 16383, "b:1")]);
        let newcomer = answer(&[(0, 8191, "a:1")]);
        // The others did not answer in time: the newcomer's view alone keeps the map in use.
        assert!(pick(std::slice::from_ref(&newcomer), SLOTS).is_none());
        // Two nodes agree that b's slots have no primary (b died without a replica): taken.
        assert_eq!(pick(&[newcomer.clone(), newcomer.clone()], SLOTS), Some(&newcomer));
        // A complete answer wins over any number of narrower ones, and a lone view is taken at start.
        assert_eq!(
            pick(&[newcomer.clone(), newcomer.clone(), whole.clone()], SLOTS),
            Some(&whole)
        );
        assert_eq!(pick(std::slice::from_ref(&newcomer), 0), Some(&newcomer));
    }
}
