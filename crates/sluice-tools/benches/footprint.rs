//! Redis memory per key and Lua script cost, for every algorithm: `cargo bench --bench footprint`.
//!
//! Starts its own `redis-server` on a free port, creates `KEYS` descriptors per algorithm through the real Redis store
//! (one hit each), and reads Redis's own accounting: `INFO memory` before and after (bytes per descriptor, all keys
//! included), `MEMORY USAGE` of one key, and `INFO commandstats` for the microseconds per script call (FCALL) of a steady-state
//! hit. Prints a Markdown table for BENCHMARKS.md.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_core::rules::Algorithm;
use sluice_core::store::Counters;
use sluice_core::store::Mode;
use sluice_core::store::redis::{RedisSettings, RedisStore};
use sluice_core::store::{CounterKey, Hit, TierSpec};

/// Descriptors per algorithm; `cargo test --benches` (no `--bench` flag) runs a quick smoke pass with few.
const KEYS: usize = 20_000;
const SMOKE_KEYS: usize = 200;
const BATCH: usize = 100;

struct Redis {
    child: Child,
    port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Redis {
    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let redis = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while redis.cli(&["PING"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// `used_memory` from `INFO memory`, in bytes.
    fn used_memory(&self) -> f64 {
        let info = self.cli(&["INFO", "memory"]);
        let value = info.lines().find_map(|l| l.strip_prefix("used_memory:"));
        value.and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    }

    /// `usec_per_call` of the decision script's calls from `INFO commandstats`: FCALL's, or EVALSHA's where the
    /// server refuses functions.
    fn script_usec(&self) -> f64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let line = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_fcall:"))
            .or_else(|| info.lines().find_map(|l| l.strip_prefix("cmdstat_evalsha:")))
            .unwrap_or_default();
        let value = line.split(',').find_map(|kv| kv.strip_prefix("usec_per_call="));
        value.and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
    }
}

fn hit(algorithm: Algorithm, i: usize) -> Hit {
    // A bucket's state lives until the bucket is full again: one token a minute keeps it for the measurement.
    let bucket = algorithm.is_bucket();
    let limit = if bucket { 1 } else { 1_000 };
    let window_us = 60_000_000;
    Hit {
        tiers: vec![TierSpec {
            key: CounterKey::builder("sluice:", "bench")
                .entry("user", &format!("user-{i}"))
                .finish()
                .tier(algorithm, window_us),
            algorithm,
            limit,
            window_us,
            burst: 1_000,
            cost: None,
            global: false,
        }],
        cost: 1,
        lease: format!("{i:032x}"),
        fields: vec![("user".into(), format!("user-{i}"))],
        record: None,
        mode: Mode::Hit,
    }
}

/// Fails the benchmark if the store could not decide a hit.
fn first_ok(answers: sluice_core::store::Answers) {
    for answer in answers {
        answer.expect("the store decides every hit");
    }
}

fn main() {
    let keys = if std::env::args().any(|a| a == "--bench") {
        KEYS
    } else {
        SMOKE_KEYS
    };
    let redis = Redis::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let store = runtime
        .block_on(RedisStore::connect(&RedisSettings {
            url: format!("redis://127.0.0.1:{}", redis.port),
            timeout: Duration::from_secs(5),
            pool_size: 1,
            server_time: true,
            tls: Default::default(),
        }))
        .expect("connects");
    println!(
        "| algorithm | bytes per descriptor (INFO memory) | MEMORY USAGE of one key | usec per script call (new key) | usec per script call (existing key) |"
    );
    println!("|---|---|---|---|---|");
    for algorithm in Algorithm::ALL {
        redis.cli(&["FLUSHALL"]);
        let hits: Vec<Hit> = (0..keys).map(|i| hit(algorithm, i)).collect();
        // Load the script, then measure from a clean slate.
        first_ok(runtime.block_on(store.hit(0, &hits[..1])));
        redis.cli(&["FLUSHALL"]);
        let before = redis.used_memory();
        redis.cli(&["CONFIG", "RESETSTAT"]);
        for batch in hits.chunks(BATCH) {
            first_ok(runtime.block_on(store.hit(0, batch)));
        }
        let create_usec = redis.script_usec();
        assert!(create_usec > 0.0, "{}: Redis ran no script call", algorithm.name());
        let after = redis.used_memory();
        let key = hits[keys / 2].tiers[0].key.as_str().to_string();
        let usage = redis.cli(&["MEMORY", "USAGE", &key, "SAMPLES", "0"]);
        redis.cli(&["CONFIG", "RESETSTAT"]);
        // Steady state: a second hit on each existing key (concurrency and queue then deny: their limit is not the
        // point here, their read path is).
        for batch in hits.chunks(BATCH) {
            first_ok(runtime.block_on(store.hit(0, batch)));
        }
        let again_usec = redis.script_usec();
        println!(
            "| {} | {:.0} | {} | {:.2} | {:.2} |",
            algorithm.name(),
            (after - before) / keys as f64,
            usage.trim(),
            create_usec,
            again_usec
        );
    }
}
