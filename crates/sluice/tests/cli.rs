//! The `sluice` binary's `check` command: reference-style configuration directories are accepted, and every load
//! error is rejected with a message naming the file and the path inside it.

use std::path::Path;
use std::process::Command;

/// The example configuration of `deploy/`, which the README runs.
const DEPLOY_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/config");

fn check(dir: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--config"])
        .arg(dir)
        .output()
        .expect("the sluice binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

#[test]
fn accepts_a_directory_of_reference_files() {
    let dir = dir_with(&[
        (
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: SECOND\n      requests_per_unit: 10\n  - key: path\n    value: /login\n    shadow_mode: true\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 5, name: login}\n  - key: path\n    value: /api/*\n    descriptors:\n      - key: user\n        rate_limit: {unit: hour, requests_per_unit: 1000, replaces: [{name: login}]}\n  - key: tier\n    value: internal\n    rate_limit: {unlimited: true}\n  - key: api\n    rate_limits:\n      - {unit: second, requests_per_unit: 10, name: multi_s}\n      - {unit: minute, requests_per_unit: 100, name: multi_m}\n",
        ),
        (
            "internal.yml",
            "domain: internal\ndescriptors:\n  - key: service\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
        ),
        ("README.txt", "not a config"),
        (".hidden.yaml", "this is: [not: valid"),
    ]);
    let (ok, stdout, stderr) = check(dir.path());
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("2 file(s), 2 domain(s), 6 rule(s)"), "{stdout}");
    assert!(
        stdout.contains("edge.path_/login: 5 per minute (fixed_window), name login, shadow mode"),
        "{stdout}"
    );
    // A rule of several limits shows every limit's name.
    assert!(
        stdout.contains(
            "edge.api: 10 per second (fixed_window), name multi_s and 100 per minute (fixed_window), name multi_m"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("domain internal"), "{stdout}");
}

#[test]
fn rejects_every_load_error_naming_file_and_path() {
    let cases: &[(&str, &str)] = &[
        ("descriptors: []\n", "domain: domain is empty"),
        (
            "domain: d\ndescriptors:\n  - value: x\n",
            "descriptors[0].key: descriptor key is empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: b\n    descriptors:\n      - key: c\n        value: v\n      - key: c\n        value: v\n",
            "descriptors[1].descriptors[1]: duplicate descriptor 'd.b.c_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "descriptors[0].rate_limit.unit: unknown unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: hour}\n",
            "descriptors[0].rate_limit.unit: a rule cannot be unlimited and have a unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, replaces: [{name: ''}]}\n",
            "descriptors[0].rate_limit.replaces[0].name: replaces entry is empty",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, name: me, replaces: [{name: me}]}\n",
            "descriptors[0].rate_limit.replaces[0].name: a rule cannot replace itself ('me')",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n   value: b\n",
            "did not find expected",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    colour: red\n",
            "descriptors[0]: unknown field `colour`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    7: b\n",
            "descriptors[0]: unknown field `7`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: -5}\n",
            "descriptors[0].rate_limit.requests_per_unit: invalid type: integer `-5`, expected u32",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 99999999999}\n",
            "descriptors[0].rate_limit.requests_per_unit: invalid value",
        ),
    ];
    for (text, want) in cases {
        let dir = dir_with(&[("a-ok.yaml", "domain: fine\n"), ("b-bad.yaml", text)]);
        let (ok, _, stderr) = check(dir.path());
        assert!(!ok, "{text} was accepted");
        assert!(stderr.contains("b-bad.yaml"), "file not named: {stderr}");
        assert!(stderr.contains(want), "want {want:?} in {stderr}");
    }
    let dir = dir_with(&[("one.yaml", "domain: same\n"), ("two.yaml", "domain: same\n")]);
    let (ok, _, stderr) = check(dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("'") && stderr.contains("two.yaml': domain: domain 'same' is also defined in"),
        "{stderr}"
    );
}

#[test]
fn bad_flags_and_env_are_named() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["serve", "--config", DEPLOY_CONFIG, "--grpc-addr", "nowhere"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--grpc-addr"), "{err}");
    // Failure policies are spelled as in the YAML files (fail_open) or with dashes, by flag and by variable: a
    // valid spelling gets past the policy to the next bad flag, an invalid one is named.
    let config = DEPLOY_CONFIG;
    for (flag, env) in [
        (Some("fail_open"), None),
        (Some("fail-closed"), None),
        (None, Some("fail_closed")),
        (None, Some("fail-open")),
    ] {
        let mut args = vec!["serve", "--config", config, "--grpc-addr", "nowhere"];
        args.extend(flag.iter().flat_map(|f| ["--failure-policy", *f]));
        let env: Vec<(&str, &str)> = env.iter().map(|v| ("SLUICE_FAILURE_POLICY", *v)).collect();
        let (code, err) = run(&args, &env);
        assert_eq!(code, Some(2));
        assert!(
            err.contains("--grpc-addr") && !err.contains("--failure-policy"),
            "{flag:?} {env:?}: {err}"
        );
    }
    let (code, err) = run(&["serve", "--config", config, "--failure-policy", "fail_sideways"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--failure-policy") && err.contains("fail_sideways"),
        "{err}"
    );
    let (code, err) = run(&["serve", "--config", DEPLOY_CONFIG], &[("SLUICE_KEY_PREFIX", "a{b")]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--key-prefix") && err.contains("may not contain"), "{err}");
    let (code, err) = run(
        &["serve", "--config", DEPLOY_CONFIG],
        &[("SLUICE_NEAR_LIMIT_RATIO", "2")],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("not a ratio"), "{err}");
    let (code, err) = run(
        &["serve", "--config", DEPLOY_CONFIG],
        &[("SLUICE_WORKER_THREADS", "2000")],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("--worker-threads") && err.contains("0..=1024"), "{err}");
    let (code, err) = run(
        &[
            "serve",
            "--config",
            "/nonexistent/sluice.yaml",
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("config '/nonexistent/sluice.yaml': cannot read"), "{err}");
}

/// `sluice serve` on the example configuration of `deploy/` with `extra` flags and its log to `stderr`; its gRPC port,
/// and whether it listened within 10 s.
fn serve_deploy(extra: &[&str], stderr: std::process::Stdio) -> (std::process::Child, u16, bool) {
    let port = crate::harness::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config", DEPLOY_CONFIG, "--grpc-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--http-addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let listening = crate::harness::poll_until(std::time::Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (child, port, listening)
}

/// `--worker-threads` sets how many runtime threads serve requests: with 1 the main thread serves alone (the
/// current-thread scheduler), with n there are n workers. Either way the server answers and drains on SIGTERM.
#[test]
fn worker_threads_sets_the_serving_threads() {
    let workers = |n: &str| -> usize {
        // The runtime is built before the listener binds: once the port answers, every worker exists.
        let (mut child, port, listening) = serve_deploy(&["--worker-threads", n], std::process::Stdio::null());
        let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id())).unwrap();
        let seen = tasks
            .filter_map(Result::ok)
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "tokio-rt-worker"))
            .count();
        let answer = crate::harness::one_call(port, "remote_address", "10.0.0.1");
        let term = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let exit = child.wait().unwrap();
        assert!(listening, "sluice serve --worker-threads {n} did not start");
        let remaining = answer
            .as_ref()
            .ok()
            .map(|r| (r.overall_code, r.statuses[0].limit_remaining));
        assert_eq!(remaining, Some((1, 9)), "--worker-threads {n}: {answer:?}");
        assert!(
            term.success() && exit.success(),
            "--worker-threads {n}: no graceful exit: {exit}"
        );
        seen
    };
    assert_eq!(workers("1"), 0);
    assert_eq!(workers("3"), 3);
}

/// `sluice serve` serves `POST /json` only on `--json-addr` (here through its variable), never on the admin port.
#[test]
fn the_json_api_is_served_on_json_addr_only() {
    use std::io::{Read, Write};
    let (http, json) = (crate::harness::free_port(), crate::harness::free_port());
    let mut child = serve_command(&[])
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{http}"))
        .env("SLUICE_JSON_ADDR", format!("127.0.0.1:{json}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listening = crate::harness::poll_until(std::time::Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", json)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
    });
    let post = |port: u16| -> String {
        let body =
            r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.9"}]}]}"#;
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .write_all(crate::harness::post_request("/json", body).as_bytes())
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response
    };
    let (on_json, on_admin) = if listening {
        (post(json), post(http))
    } else {
        Default::default()
    };
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    assert!(listening, "sluice serve did not start");
    assert!(on_json.starts_with("HTTP/1.1 200"), "{on_json}");
    assert!(on_json.contains(r#""limitRemaining":9"#), "{on_json}");
    assert!(on_admin.starts_with("HTTP/1.1 404"), "{on_admin}");
}

#[test]
fn merge_domains_merges_files_of_one_domain() {
    let dir = dir_with(&[
        (
            "a.yaml",
            "domain: d\ndescriptors:\n  - {key: k1, rate_limit: {unit: second, requests_per_unit: 1}}\n",
        ),
        (
            "b.yaml",
            "domain: d\ndescriptors:\n  - {key: k2, rate_limit: {unit: hour, requests_per_unit: 2}}\n",
        ),
    ]);
    let (ok, _, stderr) = check(dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("b.yaml") && stderr.contains("also defined in") && stderr.contains("a.yaml"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--merge-domains", "--config"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("2 file(s), 1 domain(s), 2 rule(s)"), "{stdout}");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "--config"])
        .arg(dir.path())
        .env("SLUICE_MERGE_DOMAINS", "true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The log as a pipe receives it: plain text without colour codes by default, one JSON object per line with
/// `--log-format json`, each carrying the same fields (the start message names its listeners in both).
#[test]
fn logs_are_plain_text_or_json_when_not_a_terminal() {
    let run = |format: &str| -> String {
        let (child, _, listening) = serve_deploy(&["--log-format", format], std::process::Stdio::piped());
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let out = child.wait_with_output().unwrap();
        assert!(listening, "sluice did not start with --log-format {format}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let text = run("text");
    assert!(
        !text.is_empty() && !text.contains('\u{1b}'),
        "colour codes in a pipe: {text:?}"
    );
    let json = run("json");
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty() && !json.contains('\u{1b}'));
    for line in &lines {
        for field in ["timestamp", "level", "fields", "target"] {
            assert!(line.get(field).is_some(), "{field} missing: {line}");
        }
    }
    // The same events carry the same fields in both forms.
    let first = &lines[0];
    let message = first["fields"]["message"].as_str().unwrap_or_default();
    let text_line = text
        .lines()
        .find(|l| l.contains(message))
        .unwrap_or_else(|| panic!("{message:?} not in {text}"));
    for (name, value) in first["fields"].as_object().into_iter().flatten() {
        if name != "message" {
            let value = value.as_str().map_or_else(|| value.to_string(), str::to_string);
            assert!(
                text_line.contains(&format!("{name}={value}")) || text_line.contains(&value),
                "{name} in {text_line}"
            );
        }
    }
}

/// Regions: bad names, a malformed or duplicate region list and a region without Redis are named, by flag and by
/// variable; a region whose Redis cannot be reached at start does not stop the server, which answers and names it in
/// its readiness.
#[test]
fn region_flags_are_checked_and_an_unreachable_region_does_not_stop_the_server() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = serve_command(&["--http-addr", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let redis = "redis://127.0.0.1:1";
    for (args, env, want) in [
        (vec!["--region", "eu"], vec![], "--redis-url"),
        (vec!["--region-redis", "us=redis://a"], vec![], "--region"),
        (
            vec!["--redis-url", redis, "--region", "eu", "--region-redis", "us"],
            vec![],
            "not NAME=URL",
        ),
        (
            vec!["--redis-url", redis, "--region", "eu", "--region-redis", "eu=redis://a"],
            vec![],
            "named twice",
        ),
        (
            vec!["--redis-url", redis, "--region", "eu"],
            vec![("SLUICE_REGION_REDIS", "us=redis://a,us=redis://b")],
            "--region-redis: region 'us' is named twice",
        ),
        (vec!["--redis-url", redis, "--region", "e u"], vec![], "--region 'e u'"),
        (
            vec!["--redis-url", redis, "--region", "eu", "--region-interval-ms", "0"],
            vec![],
            "--region-interval-ms",
        ),
    ] {
        let (code, err) = run(&args, &env);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
    }

    let server = crate::harness::RedisServer::start();
    let closed = crate::harness::free_port();
    let http = crate::harness::free_port();
    let mut child = serve_command(&["--http-addr", &format!("127.0.0.1:{http}")]);
    child
        .args(["--redis-url", &server.url(), "--region", "eu", "--region-redis"])
        .arg(format!("us=redis://127.0.0.1:{closed}"));
    let body = readyz_until(&mut child, http, |body| body.contains("region us: not linked"));
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("region us: not linked"), "{body}");
}

/// A Redis that holds another storage format than this version's is refused at start, with a message naming the
/// marker and what it holds; one that holds nothing is served, and the marker records this version's format.
#[test]
fn a_redis_of_another_storage_format_is_refused_at_start() {
    let server = crate::harness::RedisServer::start();
    server.cli(&["SET", "sluice:format", "0"]);
    let serve = |extra: &[&str]| {
        let mut command = serve_command(&["--redis-url", &server.url()]);
        command.args(extra);
        command
    };
    let out = serve(&["--http-addr", "127.0.0.1:0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("storage format '0'") && err.contains("'sluice:format'"),
        "{err}"
    );
    assert_eq!(
        server.cli(&["--raw", "GET", "sluice:format"]).trim(),
        "0",
        "left as it was"
    );

    let http = crate::harness::free_port();
    let mut command = serve(&["--key-prefix", "fresh:", "--http-addr", &format!("127.0.0.1:{http}")]);
    let body = readyz_until(&mut command, http, |body| body.starts_with("HTTP/1.1 200"));
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert_eq!(
        server.cli(&["--raw", "GET", "fresh:format"]).trim(),
        sluice::store::redis::FORMAT
    );
}

/// Starts `command` (a `sluice serve` whose HTTP listener is on `http`), reads its `/readyz` until `done` holds of it
/// (ten seconds at most), stops it with SIGTERM and returns the last answer read.
fn readyz_until(command: &mut Command, http: u16, done: impl Fn(&str) -> bool) -> String {
    let mut child = command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut body = String::new();
    crate::harness::poll_until(std::time::Duration::from_secs(10), || {
        body = crate::harness::get(http, "/readyz");
        done(&body)
    });
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    body
}

/// `sluice serve` of `deploy/`'s configuration, gRPC on a free port, with `extra`.
fn serve_command(extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
    command
        .args(["serve", "--config", DEPLOY_CONFIG, "--grpc-addr", "127.0.0.1:0"])
        .args(extra);
    command
}
