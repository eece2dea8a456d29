//! `sluice-client`, the built binary, against an in-process sluice server.

use std::process::Command;

/// `sluice-client` against a running server: a decision, GetRemaining, OVER_LIMIT's exit code, and bad flags.
#[tokio::test(flavor = "multi_thread")]
async fn client_calls_a_running_server() {
    let yaml = "domain: edge\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 2, name: login}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}\n";
    let (l, _) = crate::harness::limiter(yaml, crate::harness::memory());
    let server = crate::harness::TestServer::start(l).await;
    let target = server.grpc_url();
    let run = move |args: Vec<&'static str>| {
        let target = target.clone();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_sluice-client"))
                .args(["--target", &target])
                .args(args)
                .output()
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
            )
        })
    };
    let (code, out) = run(vec![
        "--domain",
        "edge",
        "--descriptor",
        "path=/login",
        "--descriptor",
        "user=42",
    ])
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("overall: OK"), "{out}");
    assert!(
        out.contains("descriptor 0: OK, 1 of 2 per MINUTE left (login), resets in 50s"),
        "{out}"
    );
    assert!(out.contains("descriptor 1: OK, 4 of 5 per HOUR left"), "{out}");
    let (code, out) = run(vec!["--domain", "edge", "--descriptor", "path=/login", "--remaining"])
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("descriptor 0: 1 of 2 per 1 MINUTE (fixed_window login), retry after 0.000s"),
        "{out}"
    );
    run(vec!["--domain", "edge", "--descriptor", "path=/login"])
        .await
        .unwrap();
    let (code, out) = run(vec!["--domain", "edge", "--descriptor", "path=/login"])
        .await
        .unwrap();
    assert_eq!(code, Some(2), "OVER_LIMIT exits 2: {out}");
    assert!(out.contains("overall: OVER_LIMIT"), "{out}");
    let (code, out) = run(vec!["--domain", "edge", "--descriptor", "path"]).await.unwrap();
    assert_eq!(code, Some(2), "clap usage error: {out}");
    assert!(out.contains("'path' is not key=value"), "{out}");
    let (code, out) = run(vec!["--domain", "", "--descriptor", "a=b"]).await.unwrap();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("InvalidArgument: domain is empty"), "{out}");
    server.shutdown().await;
}

/// `sluice-client --list` and `--offenders`: entries added (with a TTL), printed and removed, a request then denied
/// by the list, the top offenders printed; the admin token required.
#[tokio::test(flavor = "multi_thread")]
async fn client_manages_lists_and_prints_offenders() {
    let yaml = "domain: edge\nlists:\n  - {name: blocked, key: remote_address}\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let (l, _) = crate::harness::limiter(yaml, crate::harness::memory());
    let server = crate::harness::TestServer::start(l).await;
    let target = server.grpc_url();
    let run = move |args: &[&str], token: bool| {
        let (target, args) = (target.clone(), args.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        tokio::task::spawn_blocking(move || {
            let mut command = Command::new(env!("CARGO_BIN_EXE_sluice-client"));
            command.args(["--target", &target, "--domain", "edge"]).args(args);
            if token {
                command.env("SLUICE_ADMIN_TOKEN", crate::harness::ADMIN_TOKEN);
            }
            let out = command.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            (out.status.code(), text)
        })
    };
    let (code, out) = run(&["--list", "blocked"], false).await.unwrap();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("Unauthenticated: GetListEntries needs the admin token"),
        "{out}"
    );
    let (code, out) = run(
        &[
            "--list",
            "blocked",
            "--add",
            "203.0.113.0/24",
            "--add",
            "bot-*",
            "--ttl",
            "600",
        ],
        true,
    )
    .await
    .unwrap();
    assert_eq!((code, out.trim()), (Some(0), "added 2"));
    run(&["--list", "blocked", "--add", "2001:db8::/32"], true)
        .await
        .unwrap();
    let (code, out) = run(&["--list", "blocked"], true).await.unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "2001:db8::/32",
            "203.0.113.0/24 expires in 600s",
            "bot-* expires in 600s"
        ]
    );
    let (code, out) = run(&["--descriptor", "remote_address=203.0.113.9"], false)
        .await
        .unwrap();
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("descriptor 0: OVER_LIMIT, denied by a list"), "{out}");
    assert!(out.contains("header X-Sluice-List-Deny: blocked"), "{out}");
    let (code, out) = run(&["--list", "blocked", "--remove", "203.0.113.0/24"], true)
        .await
        .unwrap();
    assert_eq!((code, out.trim()), (Some(0), "removed 1"));
    let (code, out) = run(&["--list", "blocked", "--add", "10.0.0.0/99"], true).await.unwrap();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("InvalidArgument: values[0]: '10.0.0.0/99' is not a CIDR range"),
        "{out}"
    );
    let (code, out) = run(&["--list", "blocked", "--ttl", "5"], true).await.unwrap();
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--ttl goes with --reserve or --add"), "{out}");
    // Three hits on a limit of 2: one denial, printed once the server has stored the last second's counts.
    for _ in 0..3 {
        run(&["--descriptor", "remote_address=192.0.2.1"], false).await.unwrap();
    }
    let start = std::time::Instant::now();
    loop {
        let (code, out) = run(&["--offenders", "minute", "--limit", "5"], true).await.unwrap();
        assert_eq!(code, Some(0), "{out}");
        if out.contains("  denied 1 remote_address=192.0.2.1") {
            assert!(out.starts_with("rule edge.remote_address\n"), "{out}");
            assert!(out.contains("  hits   3 remote_address=192.0.2.1"), "{out}");
            break;
        }
        assert!(
            start.elapsed() < 2 * sluice::limiter::FLUSH_EVERY + std::time::Duration::from_secs(2),
            "{out}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    server.shutdown().await;
}

/// The README's `sluice-client` commands, as written, against a server on `deploy/config` (the README's server):
/// its build line builds the client, and each command succeeds with the answer its comment shows.
#[tokio::test(flavor = "multi_thread")]
async fn the_readmes_client_commands_work_as_written() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let build = readme
        .lines()
        .find(|l| l.starts_with("cargo build") && l.contains("--bin sluice-client"))
        .expect("the README builds sluice-client");
    assert!(build.contains("-p sluice-tools"), "{build}");
    let commands: Vec<&str> = readme.lines().filter(|l| l.starts_with("sluice-client ")).collect();
    assert!(commands.len() >= 3, "{commands:?}");

    let yaml = std::fs::read_to_string(format!("{root}/deploy/config/edge.yaml")).unwrap();
    let (l, _) = crate::harness::limiter(&yaml, crate::harness::memory());
    let server = crate::harness::TestServer::start(l).await;
    for line in commands {
        let (command, comment) = line.split_once('#').unwrap_or((line, ""));
        let args: Vec<String> = command.split_whitespace().skip(1).map(String::from).collect();
        let target = server.grpc_url();
        let (code, out) = tokio::task::spawn_blocking(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_sluice-client"))
                .args(args)
                .env("SLUICE_TARGET", target)
                .env("SLUICE_ADMIN_TOKEN", crate::harness::ADMIN_TOKEN)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            (out.status.code(), text)
        })
        .await
        .unwrap();
        assert_eq!(code, Some(0), "{line}: {out}");
        let shown = comment.trim();
        if shown.starts_with("added") || shown.contains("expires in") {
            assert_eq!(out.trim(), shown, "{line}");
        }
    }
    server.shutdown().await;
}

/// `sluice-empty`, the yardstick of `benches/empty.sh`, answers Envoy's ShouldRateLimit OK with one status per
/// descriptor.
#[test]
fn the_empty_server_answers_ok_per_descriptor() {
    let port = crate::harness::free_port();
    let mut server = Command::new(env!("CARGO_BIN_EXE_sluice-empty"))
        .args(["--grpc-addr", &format!("127.0.0.1:{port}"), "--worker-threads", "1"])
        .spawn()
        .unwrap();
    let call = || {
        Command::new(env!("CARGO_BIN_EXE_sluice-client"))
            .args(["--target", &format!("http://127.0.0.1:{port}"), "--domain", "any"])
            .args(["--descriptor", "a=1", "--descriptor", "b=2"])
            .output()
            .unwrap()
    };
    let mut out = call();
    crate::harness::poll_until(std::time::Duration::from_secs(10), || {
        out = call();
        out.status.success()
    });
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("overall: OK"), "{text}");
    assert!(
        text.contains("descriptor 0: OK") && text.contains("descriptor 1: OK"),
        "{text}"
    );
    assert!(!text.contains("descriptor 2"), "{text}");
}
