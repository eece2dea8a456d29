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
