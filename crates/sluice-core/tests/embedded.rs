//! `examples/embedded.rs`, the built example, limiting its own HTTP requests in-process: in memory, and on a
//! test Redis.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::harness::RedisServer;

/// The example's binary, which `cargo test` builds next to the test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    dir.join("examples").join("embedded")
}

/// The example serving on a free port; killed when dropped.
struct Embedded {
    child: Child,
    addr: String,
}

impl Embedded {
    fn start(redis: Option<&str>) -> Embedded {
        let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/embedded.yaml");
        let mut command = Command::new(example());
        command.args(["--config", config, "--listen", "127.0.0.1:0"]);
        if let Some(url) = redis {
            command.args(["--redis", url]);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the embedded example is built by cargo test");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("it prints its address");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .to_string();
        Embedded { child, addr }
    }

    /// `GET /` as `user`: the status code and the `retry-after` header, if any.
    fn get(&self, user: &str) -> (u16, Option<String>) {
        let mut stream = TcpStream::connect(&self.addr).expect("the example listens");
        let request = format!("GET / HTTP/1.1\r\nHost: t\r\nx-user: {user}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let retry = response
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after: ").map(str::to_string));
        (status, retry)
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three requests a minute per user, then 429 with a retry time; other users are unaffected.
fn limits_its_own_requests(app: &Embedded, user: &str) {
    for i in 0..3 {
        assert_eq!(app.get(user).0, 200, "request {i} of {user}");
    }
    let (status, retry) = app.get(user);
    assert_eq!(status, 429, "the fourth request of {user} in a minute");
    let wait: u64 = retry.expect("429 carries retry-after").trim().parse().unwrap();
    assert!((1..=60).contains(&wait), "retry after {wait} s");
    assert_eq!(app.get(&format!("{user}-other")).0, 200, "another user is unaffected");
}

#[test]
fn the_embedded_example_limits_in_memory() {
    let app = Embedded::start(None);
    limits_its_own_requests(&app, "alice");
}

#[test]
fn the_embedded_example_limits_on_redis_shared_by_instances() {
    let redis = RedisServer::start();
    let (a, b) = (Embedded::start(Some(&redis.url())), Embedded::start(Some(&redis.url())));
    limits_its_own_requests(&a, "bob");
    assert_eq!(b.get("bob").0, 429, "a second instance shares the counters in Redis");
}
