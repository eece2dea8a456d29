//! A Redis Cluster of three primaries with one replica each.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{free_port, info_field, poll_until, redis_cli};
use crate::redis::{RedisProcess, server_args};

/// A Redis Cluster of three primaries with one replica each, on free ports in a temporary directory, with a node
/// timeout of one second so that a replica takes over quickly. Every node is killed when dropped.
pub struct RedisCluster {
    pub nodes: Vec<RedisProcess>,
    dir: tempfile::TempDir,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let cluster = RedisCluster::unformed();
        cluster.create();
        cluster
    }

    /// Six cluster-enabled nodes that know nothing of each other yet: no slot is served until [`Self::create`].
    pub fn unformed() -> RedisCluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let nodes: Vec<RedisProcess> = (0..6)
            .map(|_| RedisCluster::spawn_node(dir.path(), free_port()))
            .collect();
        RedisCluster { nodes, dir }
    }

    /// Forms the cluster (`redis-cli --cluster create`, one replica per primary) and waits until it has settled.
    pub fn create(&self) {
        let nodes = &self.nodes;
        let addresses: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let mut create = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli must be installed");
        let created = poll_until(Duration::from_secs(30), || matches!(create.try_wait(), Ok(Some(_))));
        if !created {
            let _ = create.kill();
            let _ = create.wait();
            panic!("redis-cli --cluster create did not finish");
        }
        assert!(
            self.wait_settled(Duration::from_secs(20)),
            "the cluster did not reach cluster_state:ok with three synced replicas"
        );
    }

    fn spawn_node(dir: &Path, port: u16) -> RedisProcess {
        let mut args = server_args(port, dir);
        args.extend(
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--cluster-port",
                &free_port().to_string(),
                "--cluster-node-timeout",
                "1000",
                // While one primary's slots fail over, the other primaries keep answering for theirs.
                "--cluster-require-full-coverage",
                "no",
            ]
            .map(String::from),
        );
        RedisProcess::spawn(port, &args, Some(dir.join(format!("{port}.log"))))
    }

    /// Until every live node says `cluster_state:ok`, there are three primaries and every replica's link is up.
    pub fn wait_settled(&self, limit: Duration) -> bool {
        poll_until(limit, || {
            let live: Vec<u16> = self.nodes.iter().filter(|n| n.alive()).map(|n| n.port).collect();
            let ok = live.iter().all(|&p| {
                redis_cli(p, &["CLUSTER", "INFO"])
                    .lines()
                    .any(|l| l.trim() == "cluster_state:ok")
            });
            let replicas_synced = live.iter().all(|&p| {
                info_field(p, "replication", "role").as_deref() != Some("slave")
                    || info_field(p, "replication", "master_link_status").as_deref() == Some("up")
            });
            ok && replicas_synced && self.primaries().len() == 3
        })
    }

    /// `redis-cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let mut nodes = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port));
        let first = nodes.next().unwrap_or_default();
        let rest: Vec<String> = nodes.map(|n| format!("node={n}")).collect();
        format!("redis-cluster://{first}?{}", rest.join("&"))
    }

    /// The ports of the live nodes that are primaries owning slots.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive())
            .map(|n| n.port)
            .filter(|&p| info_field(p, "replication", "role").as_deref() == Some("master") && owns_slots(p))
            .collect()
    }

    /// The live primary holding a key that contains `needle`.
    pub fn owner_of(&self, needle: &str) -> Option<u16> {
        self.primaries()
            .into_iter()
            .find(|&p| keys(p).iter().any(|k| k.contains(needle)))
    }

    /// The live primary whose own view says it serves `slot`.
    pub fn slot_owner(&self, slot: u16) -> Option<u16> {
        self.primaries()
            .into_iter()
            .find(|&p| own_slots(p).iter().any(|&(a, b)| (a..=b).contains(&slot)))
    }

    pub fn node(&mut self, port: u16) -> &mut RedisProcess {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// Starts a seventh node and adds it to the cluster as a primary without slots (`redis-cli --cluster add-node`),
    /// waiting until every node knows it and it sees the cluster whole; returns its port.
    pub fn add_primary(&mut self) -> u16 {
        let node = RedisCluster::spawn_node(self.dir.path(), free_port());
        let port = node.port;
        self.nodes.push(node);
        let (new, existing) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{}", self.nodes[0].port));
        let out = Command::new("redis-cli")
            .args(["--cluster", "add-node", &new, &existing])
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "add-node: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let id = node_id(port);
        let known = poll_until(Duration::from_secs(20), || {
            self.nodes
                .iter()
                .all(|n| redis_cli(n.port, &["CLUSTER", "NODES"]).contains(&id))
                && redis_cli(port, &["CLUSTER", "INFO"])
                    .lines()
                    .any(|l| l.trim() == "cluster_state:ok")
        });
        assert!(known, "every node knows the new primary, and it knows the cluster");
        port
    }

    /// Starts a killed node again on its port, with its `nodes-P.conf` (so it rejoins as the same node).
    pub fn restart(&mut self, port: u16) {
        let node = RedisCluster::spawn_node(self.dir.path(), port);
        *self.node(port) = node;
    }
}

/// Whether a node's own line in `CLUSTER NODES` lists slots.
fn owns_slots(port: u16) -> bool {
    redis_cli(port, &["CLUSTER", "NODES"])
        .lines()
        .find(|l| l.contains("myself"))
        .is_some_and(|l| l.split(' ').count() > 8)
}

/// Moves `slots` slots, with their keys, from the primary at `from` to the one at `to`, as an operator would
/// (`redis-cli --cluster reshard`), once every node agrees on the slots (a reshard refuses to start otherwise), and
/// waits for it to finish. The error is redis-cli's output.
pub fn reshard(from: u16, to: u16, slots: u32) -> Result<(), String> {
    let at = format!("127.0.0.1:{from}");
    agreed(&at);
    let (from_id, to_id, count) = (node_id(from), node_id(to), slots.to_string());
    let out = Command::new("redis-cli")
        .args([
            "--cluster",
            "reshard",
            &at,
            "--cluster-from",
            &from_id,
            "--cluster-to",
            &to_id,
            "--cluster-slots",
            &count,
            "--cluster-yes",
        ])
        .output()
        .expect("redis-cli must be installed");
    cli_result(&out)
}

/// Spreads the slots evenly over every primary, empty ones included (`redis-cli --cluster rebalance
/// --cluster-use-empty-masters`), as an operator does after adding one, once every node agrees on the slots. The
/// error is redis-cli's output.
pub fn rebalance(any: u16) -> Result<(), String> {
    let at = format!("127.0.0.1:{any}");
    agreed(&at);
    let out = Command::new("redis-cli")
        .args(["--cluster", "rebalance", &at, "--cluster-use-empty-masters"])
        .output()
        .expect("redis-cli must be installed");
    cli_result(&out)
}

/// Waits until every node agrees on the slots, as seen from the node at `at` (a reshard refuses to start otherwise).
fn agreed(at: &str) {
    poll_until(Duration::from_secs(10), || {
        let check = Command::new("redis-cli")
            .args(["--cluster", "check", at])
            .output()
            .expect("redis-cli must be installed");
        let text = String::from_utf8_lossy(&check.stdout);
        text.contains("All nodes agree about slots configuration") && !text.contains("[WARNING]")
    });
}

/// A redis-cli run's success, or the tail of its output.
fn cli_result(out: &std::process::Output) -> Result<(), String> {
    if out.status.success() {
        return Ok(());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tail: Vec<&str> = stdout.lines().rev().take(5).collect();
    Err(format!("{} {}", tail.join(" | "), String::from_utf8_lossy(&out.stderr)))
}

/// Promotes the replica at `replica` in place of its primary, as an operator does before maintenance (`CLUSTER
/// FAILOVER`: the primary stops taking writes until the replica has caught up, so nothing is lost), and waits until
/// every node agrees on the slots again. The error says what did not happen.
pub fn failover(replica: u16) -> Result<(), String> {
    let answer = redis_cli(replica, &["CLUSTER", "FAILOVER"]);
    if answer.trim() != "OK" {
        return Err(format!("CLUSTER FAILOVER on {replica}: {answer}"));
    }
    if !poll_until(Duration::from_secs(20), || {
        info_field(replica, "replication", "role").as_deref() == Some("master") && owns_slots(replica)
    }) {
        return Err(format!("{replica} was not promoted"));
    }
    agreed(&format!("127.0.0.1:{replica}"));
    Ok(())
}

/// The port of a replica of the primary at `primary`.
pub fn replica_of(primary: u16, nodes: &[u16]) -> Option<u16> {
    nodes
        .iter()
        .copied()
        .find(|&p| info_field(p, "replication", "master_port").as_deref() == Some(primary.to_string().as_str()))
}

/// `CLUSTER SETSLOT <slot> <state> <id of node>` on the node at `port` (`IMPORTING`, `MIGRATING`, `NODE`), as a
/// reshard does step by step.
pub fn setslot(port: u16, slot: u16, state: &str, node: u16) {
    let answer = redis_cli(port, &["CLUSTER", "SETSLOT", &slot.to_string(), state, &node_id(node)]);
    assert_eq!(answer.trim(), "OK", "SETSLOT {state} on {port}");
}

/// Moves `keys` (of one slot) from the node at `from` to the one at `to` (`MIGRATE`), as a reshard does.
pub fn migrate(from: u16, to: u16, keys: &[&str]) {
    let to = to.to_string();
    let mut args = vec!["MIGRATE", "127.0.0.1", &to, "", "0", "5000", "KEYS"];
    args.extend_from_slice(keys);
    assert_eq!(redis_cli(from, &args).trim(), "OK", "MIGRATE {keys:?}");
}

/// A node's id in its cluster.
pub fn node_id(port: u16) -> String {
    redis_cli(port, &["CLUSTER", "MYID"]).trim().to_string()
}

/// The slot ranges a node's own line in `CLUSTER NODES` says it serves (slots it is migrating away included).
pub fn own_slots(port: u16) -> Vec<(u16, u16)> {
    let nodes = redis_cli(port, &["CLUSTER", "NODES"]);
    let Some(line) = nodes.lines().find(|l| l.contains("myself")) else {
        return Vec::new();
    };
    line.split(' ')
        .skip(8)
        .filter(|r| !r.starts_with('['))
        .filter_map(|r| match r.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => r.parse().ok().map(|s| (s, s)),
        })
        .collect()
}

/// Every key of a server (`KEYS *`; test servers hold few).
pub fn keys(port: u16) -> Vec<String> {
    redis_cli(port, &["KEYS", "*"])
        .lines()
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}
