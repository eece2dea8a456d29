//! A primary, its replica and a Sentinel watching them.

use std::process::Command;
use std::time::Duration;

use crate::harness::{free_port, poll_until, redis_cli};
use crate::redis::{RedisProcess, server_args};

/// One primary with one replica and one Sentinel watching them as `mymaster` (quorum 1, down after 500 ms), on
/// free ports in a temporary directory. The data servers require the password [`SENTINEL_REDIS_PASSWORD`]; the
/// Sentinel has none. Every process is killed when dropped.
pub struct RedisSentinel {
    pub primary: RedisProcess,
    pub replica: RedisProcess,
    pub sentinel: RedisProcess,
    _dir: tempfile::TempDir,
}

pub const SENTINEL_REDIS_PASSWORD: &str = "sentinel-test-pw";

impl RedisSentinel {
    pub fn start() -> RedisSentinel {
        RedisSentinel::start_on(RedisSentinel::ports())
    }

    /// Free ports for the primary, the replica and the Sentinel.
    pub fn ports() -> (u16, u16, u16) {
        (free_port(), free_port(), free_port())
    }

    /// The URL a Sentinel on `port` will answer, before it runs.
    pub fn url_for(port: u16) -> String {
        format!("redis-sentinel://:{SENTINEL_REDIS_PASSWORD}@127.0.0.1:{port}?sentinelServiceName=mymaster")
    }

    /// Starts the primary, the replica and the Sentinel on the given ports.
    pub fn start_on((p, r, s): (u16, u16, u16)) -> RedisSentinel {
        let dir = tempfile::tempdir().expect("temporary directory");
        let auth = [
            "--requirepass",
            SENTINEL_REDIS_PASSWORD,
            "--masterauth",
            SENTINEL_REDIS_PASSWORD,
        ]
        .map(String::from);
        let mut args = server_args(p, dir.path());
        args.extend(auth.clone());
        let primary = RedisProcess::spawn(p, &args, Some(dir.path().join(format!("{p}.log"))));
        let mut args = server_args(r, dir.path());
        args.extend(auth);
        args.extend(["--replicaof", "127.0.0.1", &p.to_string()].map(String::from));
        let replica = RedisProcess::spawn(r, &args, Some(dir.path().join(format!("{r}.log"))));
        let authed = |port: u16, field: &str| {
            let out = Command::new("redis-cli")
                .args([
                    "-p",
                    &port.to_string(),
                    "--no-auth-warning",
                    "-a",
                    SENTINEL_REDIS_PASSWORD,
                ])
                .args(["--raw", "INFO", "replication"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_string()))
        };
        assert!(
            poll_until(Duration::from_secs(10), || authed(r, "master_link_status").as_deref()
                == Some("up")),
            "the replica did not sync"
        );
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {s}\nbind 127.0.0.1\ndir {dir}\nlogfile {s}.log\n\
                 sentinel monitor mymaster 127.0.0.1 {p} 1\n\
                 sentinel auth-pass mymaster {SENTINEL_REDIS_PASSWORD}\n\
                 sentinel down-after-milliseconds mymaster 500\n\
                 sentinel failover-timeout mymaster 2000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir = dir.path().display()
            ),
        )
        .expect("sentinel.conf written");
        let sentinel = RedisProcess::spawn(
            s,
            &[conf.display().to_string(), "--sentinel".to_string()],
            Some(dir.path().join(format!("{s}.log"))),
        );
        let cluster = RedisSentinel {
            primary,
            replica,
            sentinel,
            _dir: dir,
        };
        assert!(
            poll_until(Duration::from_secs(15), || {
                cluster.master_port() == Some(p)
                    && redis_cli(s, &["SENTINEL", "replicas", "mymaster"]).contains(&r.to_string())
            }),
            "the sentinel did not discover the primary and its replica"
        );
        cluster
    }

    /// The primary's port as the Sentinel reports it.
    pub fn master_port(&self) -> Option<u16> {
        redis_cli(self.sentinel.port, &["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
    }

    /// `redis-sentinel://` with the data servers' password; the Sentinel itself is asked without one.
    pub fn url(&self) -> String {
        RedisSentinel::url_for(self.sentinel.port)
    }
}
