//! One `redis-server` on a free port ([`RedisServer`]), any `redis-server` process ([`RedisProcess`]), and a TCP
//! proxy in front of Redis that can hold back its replies ([`ReplyGate`]).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::harness::{ACL_PASSWORD, free_port, info_field, is_series, poll_until, readme_acl_user};

/// A `redis-server` process on a free port, killed when dropped.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        // A port free when chosen can be taken by another process before redis-server binds it; that server then
        // exits, and another port is tried, so that a test never shares a Redis it did not start.
        for _ in 0..10 {
            if let Some(server) = RedisServer::try_start_on(free_port()) {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    /// Starts on a given port, e.g. to bring a stopped server back where clients expect it.
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::try_start_on(port)
            .unwrap_or_else(|| panic!("redis-server on port {port} did not start, or another process holds the port"))
    }

    /// The server on `port` once it answers, if the one answering is the process started here; `None` if it exited
    /// (the port was taken) or another process answers.
    fn try_start_on(port: u16) -> Option<RedisServer> {
        let child = Command::new("redis-server")
            .args(base_args(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the README's test command installs it)");
        let mut server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if !matches!(server.child.try_wait(), Ok(None)) {
                return None;
            }
            if server.cli(&["PING"]).trim() == "PONG" {
                let pid = info_field(port, "server", "process_id");
                return (pid == Some(server.child.id().to_string())).then_some(server);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {port} did not start within 30 s");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Creates the documented ACL user (see [`readme_acl_user`]) for the tests' key prefix, `test:`, and returns a URL
    /// that connects as it.
    pub fn acl_user_url(&self) -> String {
        let mut args = vec!["ACL", "SETUSER"];
        let rules = readme_acl_user("test:");
        args.extend(rules.iter().map(String::as_str));
        assert_eq!(self.cli(&args).trim(), "OK", "ACL SETUSER {rules:?}");
        format!("redis://sluice:{ACL_PASSWORD}@127.0.0.1:{}", self.port)
    }

    /// Forgets every script and function, as a restart without persistence does: the next decision meets the
    /// decision script missing (NOSCRIPT, or its function not found).
    pub fn flush_scripts(&self) {
        assert_eq!(self.cli(&["FUNCTION", "FLUSH"]).trim(), "OK");
        assert_eq!(self.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    }

    /// Runs one command with `redis-cli` and returns its raw output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "--no-raw"])
            .args(args)
            .output()
            .expect("redis-cli must be installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every key with its value and remaining TTL in milliseconds, sorted: a snapshot to compare. The per-second
    /// outcome counts a server adds once a second are left out (see [`is_series`]).
    pub fn snapshot(&self) -> Vec<(String, String, i64)> {
        let keys = self.cli(&["--raw", "KEYS", "*"]);
        let mut out: Vec<_> = keys
            .lines()
            .filter(|k| !k.is_empty() && !is_series(k))
            .map(|k| {
                let value = self.cli(&["DUMP", k]).trim().to_string();
                let ttl: i64 = self.cli(&["--raw", "PTTL", k]).trim().parse().unwrap_or(-3);
                (k.to_string(), value, ttl)
            })
            .collect();
        out.sort();
        out
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Freezes the server (SIGSTOP): connections stay open and nothing answers, as with a hung host.
    pub fn pause(&self) {
        signal(self.child.id(), "STOP");
    }

    /// Lets a paused server run again (SIGCONT).
    pub fn resume(&self) {
        signal(self.child.id(), "CONT");
    }
}

/// Sends a signal to a process by its PID with `kill(1)`.
pub fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(sent, "kill -{name} {pid}");
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy in front of Redis that can hold back every reply while forwarding requests, to prove that a client
/// sends a batch of commands without waiting for answers (one round trip).
pub struct ReplyGate {
    pub port: u16,
    open: tokio::sync::watch::Sender<bool>,
}

impl ReplyGate {
    pub async fn start(redis_port: u16) -> ReplyGate {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, watcher) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut gate = watcher.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    };
                    let down = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if gate.wait_for(|open| *open).await.is_err() || cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::join!(up, down);
                });
            }
        });
        ReplyGate { port, open }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn hold(&self) {
        let _ = self.open.send(false);
    }

    pub fn release(&self) {
        let _ = self.open.send(true);
    }
}

/// A `redis-server` (or Sentinel) started with any arguments on `port`, ready once the port accepts connections,
/// killed by its PID when dropped.
pub struct RedisProcess {
    child: Option<Child>,
    pub port: u16,
    log: Option<std::path::PathBuf>,
}

impl RedisProcess {
    /// Starts `redis-server args...`; `log` is where the server writes (passed as `--logfile` by the caller, read
    /// back when the server does not come up).
    pub fn spawn(port: u16, args: &[String], log: Option<std::path::PathBuf>) -> RedisProcess {
        let child = Command::new("redis-server")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let mut process = RedisProcess {
            child: Some(child),
            port,
            log,
        };
        let up = poll_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() || process.exited()
        });
        if !up || process.exited() {
            let log = process
                .log
                .as_ref()
                .and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default();
            panic!("redis-server on port {port} did not start: {args:?}\n{log}");
        }
        process
    }

    fn exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// Kills the process (SIGKILL to its PID) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn alive(&self) -> bool {
        self.child.is_some()
    }

    /// The process's PID while it runs (for [`signal`]).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Every test server: loopback only, no persistence.
pub fn base_args(port: u16) -> Vec<String> {
    let port = port.to_string();
    [
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// The arguments of a cluster or Sentinel node: the base ones, a log file in `dir`.
pub fn server_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args = base_args(port);
    args.extend(
        [
            "--dir",
            &dir.display().to_string(),
            "--logfile",
            &format!("{port}.log"),
            // A replica's first sync starts at once instead of after the default 5 s wait for more replicas.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .map(String::from),
    );
    args
}

/// A script that lists the counters kept under the keys matching `ARGV[1]` on one server (EVAL it with no keys), two
/// lines each, a name and a count: a plain counter's window (`<counter>:<window>`, a lone fixed window's) as
/// `<counter>` and its count; each record of a packed state (`<prefix>{<slot>}#<digest>`, `lua/decide.lua`) as
/// [`record_name`] and its count (a window's; a bucket's arrival time). [`stored_counts`] reads its answer.
pub const COUNTERS_SCRIPT: &str = "local out = {} \
    for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
      local v = redis.call('GET', k) \
      if string.find(k, '}#', 1, true) then \
        local n = math.floor(#v / 40) \
        local t = { struct.unpack('<' .. string.rep('d', 5 * n), v) } \
        for r = 1, 5 * n, 5 do \
          out[#out + 1] = k .. '/' .. string.format('%d', t[r]) \
          out[#out + 1] = string.format('%d', t[r + 3]) \
        end \
      else \
        out[#out + 1] = string.match(k, '^(.*):%x+$') or k \
        out[#out + 1] = v \
      end \
    end \
    return out";

/// The counts [`COUNTERS_SCRIPT`] lists, by name, from its answer as `redis-cli` prints it.
pub fn stored_counts(answer: &str) -> std::collections::HashMap<String, u64> {
    let lines: Vec<&str> = answer.lines().collect();
    lines
        .chunks_exact(2)
        .map(|kv| (kv[0].trim().to_string(), kv[1].trim().parse().unwrap_or(u64::MAX)))
        .collect()
}

/// The name [`COUNTERS_SCRIPT`] lists the counter `key` by when Redis keeps it in its descriptor's packed state.
pub fn record_name(key: &sluice_core::store::CounterKey) -> String {
    format!("{}/{}", key.packed().as_str(), key.record())
}

impl RedisServer {
    /// The record Redis keeps for the counter `key` in its descriptor's packed state (`lua/decide.lua`): the time its
    /// state stops mattering and its three numbers (a fixed window's start and count; a sliding window's start, count
    /// and previous count; a bucket's arrival time), or `None` if there is none.
    pub fn record(&self, key: &sluice_core::store::CounterKey) -> Option<[u64; 4]> {
        let script = "local v = redis.call('GET', KEYS[1]) if not v then return {} end \
            local n = math.floor(#v / 40) local t = { struct.unpack('<' .. string.rep('d', 5 * n), v) } \
            for r = 1, 5 * n, 5 do if t[r] == tonumber(ARGV[1]) then \
              local f = function(x) return string.format('%d', x) end \
              return { f(t[r + 1]), f(t[r + 2]), f(t[r + 3]), f(t[r + 4]) } end end \
            return {}";
        let packed = key.packed();
        let out = self.cli(&["--raw", "EVAL", script, "1", packed.as_str(), &key.record().to_string()]);
        let numbers: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        numbers.try_into().ok()
    }

    /// Writes the counter `key`'s record in its descriptor's packed state, alone there, as [`RedisServer::record`]
    /// reads it: state that tests cannot reach by hits (counts near their bounds).
    pub fn set_record(&self, key: &sluice_core::store::CounterKey, record: [u64; 4], ttl_ms: u64) {
        let script = "redis.call('SET', KEYS[1], struct.pack('<ddddd', tonumber(ARGV[1]), tonumber(ARGV[2]), \
            tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])), 'PX', ARGV[6])";
        let args: Vec<String> = std::iter::once(key.record())
            .chain(record)
            .chain([ttl_ms])
            .map(|n| n.to_string())
            .collect();
        let packed = key.packed();
        let mut cli = vec!["EVAL", script, "1", packed.as_str()];
        cli.extend(args.iter().map(String::as_str));
        self.cli(&cli);
    }
}
