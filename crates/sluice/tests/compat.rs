//! The envoyproxy/ratelimit compatibility mode, as a deployment of the reference meets it: the binary run as
//! `ratelimit` with nothing but the reference's environment variables (a runtime root whose subdirectory is a
//! symlink, Redis on a unix socket as the reference's default, two files of one domain merged), answering as
//! configured and following the symlink when it is swapped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_testkit::redis::{RedisProcess, base_args};

use crate::harness::{free_port, get, poll_until};

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Points `link` at `target` in one step, as Kubernetes and the reference's runtime deployments do.
fn swap_symlink(target: &str, link: &Path) {
    let tmp = link.with_extension("tmp");
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// (overall code, remaining) of one call: 1 is OK, 2 OVER_LIMIT.
fn decide(port: u16, key: &str, value: &str) -> (i32, u32) {
    let r = crate::harness::one_call(port, key, value).unwrap();
    (r.overall_code, r.statuses[0].limit_remaining)
}

struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

#[test]
fn runs_as_ratelimit_from_the_reference_environment_and_follows_a_symlink_swap() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let limits = |user: u32| {
        format!(
            "domain: edge\ndescriptors:\n  - {{key: user, rate_limit: {{unit: hour, requests_per_unit: {user}}}}}\n"
        )
    };
    let paths = "domain: edge\ndescriptors:\n  - {key: path, rate_limit: {unit: hour, requests_per_unit: 5}}\n";
    write(&r.join("v1/config/users.yaml"), &limits(2));
    write(&r.join("v1/config/paths.yaml"), paths);
    std::os::unix::fs::symlink("v1", r.join("ratelimit")).unwrap();

    let socket = r.join("redis.sock");
    let redis_port = free_port();
    let mut args = base_args(redis_port);
    args.extend([
        "--unixsocket".to_string(),
        socket.display().to_string(),
        "--unixsocketperm".into(),
        "700".into(),
    ]);
    let _redis = RedisProcess::spawn(redis_port, &args, None);

    std::fs::create_dir(r.join("bin")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_sluice"), r.join("bin/ratelimit")).unwrap();
    let (grpc, json, debug, prometheus) = (free_port(), free_port(), free_port(), free_port());
    let log = r.join("ratelimit.log");
    let child = Command::new(r.join("bin/ratelimit"))
        .env_clear()
        .envs([
            ("RUNTIME_ROOT", r.display().to_string()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
            ("RUNTIME_WATCH_ROOT", "true".into()),
            ("MERGE_DOMAIN_CONFIG", "true".into()),
            ("REDIS_SOCKET_TYPE", "unix".into()),
            ("REDIS_URL", socket.display().to_string()),
            ("CACHE_KEY_PREFIX", "compat_".into()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", json.to_string()),
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", grpc.to_string()),
            ("DEBUG_HOST", "127.0.0.1".into()),
            ("DEBUG_PORT", debug.to_string()),
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
            ("USE_STATSD", "false".into()),
            ("LOG_LEVEL", "info".into()),
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _stop = Stop(child);
    let log = || std::fs::read_to_string(&log).unwrap_or_default();
    let up = poll_until(Duration::from_secs(15), || {
        get(json, "/healthcheck").starts_with("HTTP/1.1 200")
    });
    assert!(up, "not healthy on PORT: {}", log());

    // The merged files' rules, counted in the Redis of the unix socket under the reference's key prefix.
    assert_eq!(decide(grpc, "user", "alice"), (1, 1));
    assert_eq!(decide(grpc, "user", "alice"), (1, 0));
    assert_eq!(decide(grpc, "user", "alice"), (2, 0));
    assert_eq!(decide(grpc, "path", "/a"), (1, 4));
    let scan = Command::new("redis-cli")
        .arg("-s")
        .arg(&socket)
        .args(["--scan", "--pattern", "compat_*"])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&scan.stdout);
    // The reference's own keys (`<prefix><domain>_<key>_<value>_<window start in seconds>`), so that counts carry
    // over from it: an hour's window for alice.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let alice = keys
        .lines()
        .find(|k| k.starts_with("compat_edge_user_alice_"))
        .unwrap_or_default();
    let start: u64 = alice.trim_start_matches("compat_edge_user_alice_").parse().unwrap_or(0);
    assert!(start % 3_600 == 0 && now - start < 3_600, "{keys}");
    assert!(keys.lines().any(|k| k.starts_with("compat_edge_path_/a_")), "{keys}");
    assert!(
        get(prometheus, "/metrics").contains("sluice_"),
        "no metrics on PROMETHEUS_ADDR"
    );
    assert!(
        get(debug, "/rlconfig").contains("edge.user: 2 per hour"),
        "{}",
        get(debug, "/rlconfig")
    );
    let started = log();
    assert!(
        started.contains("RUNTIME_SUBDIRECTORY") && started.contains("MERGE_DOMAIN_CONFIG"),
        "{started}"
    );
    assert!(
        started.contains("variable ignored") && started.contains("USE_STATSD"),
        "{started}"
    );

    // The subdirectory symlink is swapped to a new version: the new rules apply, the counter carries on.
    write(&r.join("v2/config/users.yaml"), &limits(10));
    write(&r.join("v2/config/paths.yaml"), paths);
    swap_symlink("v2", &r.join("ratelimit"));
    let swapped = poll_until(Duration::from_secs(10), || {
        get(debug, "/rlconfig").contains("edge.user: 10 per hour")
    });
    assert!(swapped, "the swap was not seen: {}", log());
    assert_eq!(decide(grpc, "user", "alice"), (1, 6));

    // The watch follows the symlink: an edit inside the new version is seen too.
    write(&r.join("v2/config/users.yaml"), &limits(20));
    let edited = poll_until(Duration::from_secs(10), || {
        get(debug, "/rlconfig").contains("edge.user: 20 per hour")
    });
    assert!(edited, "an edit after the swap was not seen: {}", log());
}

#[test]
fn a_bad_or_unsupported_variable_stops_the_start_naming_it() {
    let run = |vars: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--compat", "envoy-ratelimit"])
            .env_clear()
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&[("PORT", "http")]);
    assert_eq!(code, Some(1));
    assert!(err.contains("PORT='http': not a port number"), "{err}");
    let (code, err) = run(&[("BACKEND_TYPE", "memcache")]);
    assert_eq!(code, Some(1));
    assert!(err.contains("BACKEND_TYPE='memcache' is not supported"), "{err}");
    // A bad value that only the flag parser sees still names its flag.
    let (code, err) = run(&[
        ("NEAR_LIMIT_RATIO", "2"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "127.0.0.1:1"),
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--near-limit-ratio"), "{err}");
}
