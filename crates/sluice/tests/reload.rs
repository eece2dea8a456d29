//! Hot reload against the real file system watcher: in-place writes, `mv`, `sed -i` and the Kubernetes ConfigMap
//! symlink swap are picked up; broken and empty files are rejected while the old rules keep answering; counters of
//! unchanged rules survive; SIGHUP reloads the binary.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::limiter::{Descriptor, Limiter, Report, Request};
use sluice::rules::Domains;
use sluice::sources::reload::Reloader;
use sluice::store::memory::MemoryStore;

use crate::harness::{free_port, limiter};

fn config(limit: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n"
    )
}

fn request(key: &str) -> Request {
    Request {
        domain: "edge".into(),
        descriptors: vec![Descriptor {
            entries: vec![(key.into(), "v".into())],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    }
}

/// The limit and what is left of the `key` rule, as GetRemaining reports it.
async fn limit_of(l: &Limiter<MemoryStore>, key: &str) -> (u32, u64) {
    match &l.decisions().get_remaining(&request(key), 1).await.unwrap()[0] {
        Report::Limited { limit, remaining, .. } => (limit.limit.requests, *remaining),
        other => panic!("{other:?}"),
    }
}

/// Polls until the `path` rule's limit is `want`, for at most 10 s (the watcher and debounce take well under one).
async fn until_limit(l: &Limiter<MemoryStore>, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while limit_of(l, "path").await.0 != want {
        assert!(Instant::now() < deadline, "the limit never became {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A limiter watching `path`, with the path rule at `limit`.
fn watched(path: &Path, limit: u32) -> (Arc<Limiter<MemoryStore>>, Reloader) {
    let (l, _) = limiter(&config(limit), MemoryStore::new());
    let reloader = Reloader::start(l.clone(), path.to_path_buf(), Domains::OnePerFile).expect("watches");
    (l, reloader)
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn edits_renames_and_sed_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, config(1)).unwrap();
    let (l, _reloader) = watched(&file, 1);

    std::fs::write(&file, config(2)).unwrap();
    until_limit(&l, 2).await;
    write_atomically(&file, &config(3));
    until_limit(&l, 3).await;
    let sed = Command::new("sed")
        .args(["-i", "s/requests_per_unit: 3}/requests_per_unit: 4}/"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(sed.success());
    until_limit(&l, 4).await;
    let text = l.metrics().render();
    assert!(
        text.contains(r#"sluice_config_reloads_total{result="success"} 3"#),
        "{text}"
    );
}

#[tokio::test]
async fn configmap_symlink_swap_is_picked_up() {
    // The layout the kubelet mounts: edge.yaml -> ..data/edge.yaml, ..data -> ..<timestamp>/, swapped by rename.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let version = |name: &str, limit: u32| {
        std::fs::create_dir(root.join(name)).unwrap();
        std::fs::write(root.join(name).join("edge.yaml"), config(limit)).unwrap();
    };
    version("..2026_01_01_v1", 1);
    std::os::unix::fs::symlink("..2026_01_01_v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/edge.yaml", root.join("edge.yaml")).unwrap();
    let (l, _reloader) = watched(root, 1);

    version("..2026_01_01_v2", 7);
    std::os::unix::fs::symlink("..2026_01_01_v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    until_limit(&l, 7).await;
}

#[tokio::test]
async fn broken_and_empty_files_never_replace_the_rules_and_counters_survive() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, config(5)).unwrap();
    let (l, _reloader) = watched(&file, 5);
    for _ in 0..3 {
        l.decisions().should_rate_limit(&request("user")).await.unwrap();
    }
    assert_eq!(limit_of(&l, "user").await, (10, 7));

    let failures = |l: &Limiter<MemoryStore>| {
        let text = l.metrics().render();
        let line = text
            .lines()
            .find(|l| l.starts_with(r#"sluice_config_reloads_total{result="failure"}"#));
        line.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for (text, what) in [
        ("domain: edge\ndescriptors: [\n", "broken YAML"),
        ("", "an empty file"),
        (
            "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight}\n",
            "an invalid rule",
        ),
    ] {
        let before = failures(&l);
        std::fs::write(&file, text).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while failures(&l) == before {
            assert!(Instant::now() < deadline, "{what} was never reported");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(limit_of(&l, "path").await.0, 5, "{what} replaced the rules");
        assert_eq!(
            l.decisions()
                .should_rate_limit(&request("path"))
                .await
                .unwrap()
                .statuses
                .len(),
            1
        );
    }
    // A valid change to another rule: the user counter keeps its value.
    std::fs::write(&file, config(6)).unwrap();
    until_limit(&l, 6).await;
    assert_eq!(
        limit_of(&l, "user").await,
        (10, 7),
        "the unchanged rule's counter survived the reload"
    );
}

#[test]
fn sighup_reloads_the_running_binary() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edge.yaml");
    std::fs::write(&file, config(1)).unwrap();
    let http = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(&file)
        .args([
            "--grpc-addr",
            &format!("127.0.0.1:{}", free_port()),
            "--http-addr",
            &format!("127.0.0.1:{http}"),
        ])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let metrics = || {
        use std::io::{Read, Write};
        let mut response = String::new();
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", http)) {
            let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let _ = stream.read_to_string(&mut response);
        }
        response
    };
    let wait_for = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !metrics().contains(needle) {
            assert!(Instant::now() < deadline, "metrics never showed {needle}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("sluice_config_hash");
    let kill = |signal: &str| {
        Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap()
    };
    assert!(kill("-HUP").success());
    wait_for(r#"sluice_config_reloads_total{result="success"} 1"#);
    assert!(kill("-TERM").success());
    let status = child.wait().unwrap();
    assert!(status.success(), "graceful exit after SIGTERM: {status}");
}
