//! What every component of the kit shares: the tests' time and the documented ACL user, free ports below the
//! ephemeral range, polling until a condition holds, and `redis-cli` calls with the fields of their answers.

use std::process::Command;
use std::time::{Duration, Instant};

/// A time far from any window edge of every unit: 2024-01-01T00:00:00Z plus ten seconds.
pub const T0: u64 = 1_704_067_210_000_000;

/// The password the tests give the documented ACL user.
pub const ACL_PASSWORD: &str = "s3cret-pw";

/// The rules of the documented least-privilege ACL user, as `ACL SETUSER` (or `redis-server --user`) takes them,
/// parsed from the `ACL SETUSER sluice ...` line of the docs' storage page (`docs/src/storage.md`) with [`ACL_PASSWORD`] for its `>PASSWORD` and, as the
/// docs say to do for another `--key-prefix`, `key_prefix` for the `sluice:` of `~sluice:*`.
pub fn readme_acl_user(key_prefix: &str) -> Vec<String> {
    let readme = include_str!("../../../docs/src/storage.md");
    let line = readme
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER sluice "))
        .expect("docs/src/storage.md has an `ACL SETUSER sluice ...` line");
    std::iter::once("sluice")
        .chain(line.split_whitespace())
        .map(|rule| match rule {
            ">PASSWORD" => format!(">{ACL_PASSWORD}"),
            "~sluice:*" => format!("~{key_prefix}*"),
            other => other.to_string(),
        })
        .collect()
}

/// Makes `user` on `redis` the documented ACL user (keys under `key_prefix`) without `+fcall` and `+function|load`
/// (as a Redis 6, or an ACL written before functions, leaves it), and returns its URL.
pub fn user_without_functions(redis: &crate::RedisServer, user: &str, key_prefix: &str) -> String {
    let mut rules = readme_acl_user(key_prefix);
    rules.retain(|r| r != "+fcall" && r != "+function|load");
    rules[0] = user.to_string();
    let mut setuser = vec!["ACL", "SETUSER"];
    setuser.extend(rules.iter().map(String::as_str));
    assert_eq!(redis.cli(&setuser).trim(), "OK");
    format!("redis://{user}:{ACL_PASSWORD}@127.0.0.1:{}", redis.port)
}

/// A port nobody listens on right now, for a process the test starts to listen on.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), where neither outgoing connections nor
/// listeners on port 0 are given ports: a port taken from inside that range could be handed to one of the test's
/// own connections before the process it was meant for binds it. Ports come in blocks of 64, each held by one
/// process at a time: the process listens on the block's first port for as long as it runs, and another finds it
/// taken and moves on. So two test processes running at once, on a busy machine, never pick the same port for
/// servers of their own. Each call in a process tries the next port of its block, from a first block that differs
/// per process.
pub fn free_port() -> u16 {
    use std::net::TcpListener;
    use std::sync::Mutex;
    const BLOCK: u32 = 64;
    /// The block in use, the next port's offset in it, how many blocks were tried, and the blocks' first ports held.
    struct Held {
        block: u32,
        offset: u32,
        tried: u32,
        markers: Vec<TcpListener>,
    }
    static HELD: Mutex<Held> = Mutex::new(Held {
        block: 0,
        offset: BLOCK,
        tried: 0,
        markers: Vec::new(),
    });
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let (first, blocks) = (10_000u32, (low.saturating_sub(10_000) / BLOCK).max(1));
    let start = std::process::id().wrapping_mul(7_919) % blocks;
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        while held.offset < BLOCK {
            let port = first + held.block * BLOCK + held.offset;
            held.offset += 1;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
        assert!(held.tried < blocks, "no free port on 127.0.0.1 below {low}");
        let block = (start + held.tried) % blocks;
        held.tried += 1;
        if let Ok(marker) = TcpListener::bind(("127.0.0.1", (first + block * BLOCK) as u16)) {
            held.markers.push(marker);
            (held.block, held.offset) = (block, 1);
        }
    }
}

/// Whether `key` holds a second of a domain's outcome counts (`<prefix>{<tag>}series|<domain>:<second>`, see
/// `CounterKey::series`), which a running server adds to its store once a second, heartbeat included: not a counter.
/// A test that counts or compares a store's keys leaves them out, since how many seconds it spans depends on how
/// busy the host is.
pub fn is_series(key: &str) -> bool {
    key.contains("}series|")
}

/// Runs `redis-cli` against a plain port and returns its raw (`--raw`) output.
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "--raw"])
        .args(args)
        .output()
        .expect("redis-cli must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One field of `INFO` output (`INFO <section>`), e.g. `role` or `master_link_status`.
pub fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let prefix = format!("{field}:");
    redis_cli(port, &["INFO", section])
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

/// How many calls of the decision script a server has run: FCALLs of its function, and EVALSHAs where the server
/// refuses functions (the regions' and the key move's scripts, called by EVALSHA too, count as well).
pub fn script_calls(port: u16) -> u64 {
    redis_cli(port, &["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Polls `check` every 50 ms until it holds or `limit` passes; says whether it held.
pub fn poll_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
