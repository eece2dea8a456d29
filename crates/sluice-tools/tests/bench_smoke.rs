//! `sluice-bench` against an in-process server: every request is counted once and every answer checked, over both
//! APIs, in a closed loop and at a fixed rate. The server's clock never moves, so the counts are exact: a hot key
//! limited to 50 per hour gets exactly 50 OK answers, however many requests the run manages to send.

use clap::Parser;
use sluice_tools::bench::{self, BenchArgs, Report};

use crate::harness::{TestServer, limiter, memory};

const CONFIG: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50}
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 5}
";

/// `sluice-bench`'s flags, parsed as the binary parses them.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

async fn bench(server: &TestServer, flags: &[&str]) -> Report {
    let target = server.grpc_url();
    let mut argv = vec!["bench", "--target", &target, "--domain", "bench", "--quiet"];
    argv.extend_from_slice(flags);
    let args = Cli::try_parse_from(argv).expect("the flags parse").args;
    bench::run(args).await.expect("the load runs")
}

/// Every measured request got a well-formed answer and is counted as OK or OVER_LIMIT.
fn assert_all_checked(report: &Report) {
    assert!(report.requests > 0, "no request measured:\n{report}");
    assert_eq!(report.requests, report.ok + report.over_limit, "\n{report}");
    assert_eq!(report.error_count(), 0, "\n{report}");
    assert_eq!(report.failed_checks, 0, "\n{report}");
    assert!(report.passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_over_both_apis_counts_every_answer() {
    for api in ["envoy", "sluice"] {
        let server = TestServer::start(limiter(CONFIG, memory()).0).await;
        let report = bench(
            &server,
            &[
                "--api",
                api,
                "--duration",
                "1s",
                "--connections",
                "2",
                "--concurrency",
                "8",
            ],
        )
        .await;
        assert_all_checked(&report);
        assert_eq!(report.ok, 50, "{api}: the hot key's limit\n{report}");
        assert!(report.over_limit > 0, "{api}\n{report}");
        assert!(report.service_time.is_none());
        assert!(report.latency.max >= report.latency.p50 && report.latency.p50 > std::time::Duration::ZERO);
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_rate_keeps_to_its_schedule() {
    let server = TestServer::start(limiter(CONFIG, memory()).0).await;
    let report = bench(
        &server,
        &[
            "--api",
            "sluice",
            "--rate",
            "500",
            "--duration",
            "1s",
            "--keys",
            "zipf:100",
            "--descriptors",
            "2",
            "--parent-entry",
            "path=/api/v1",
            "--concurrency",
            "4",
        ],
    )
    .await;
    assert_all_checked(&report);
    assert_eq!(report.setup.scheduled, Some(500));
    assert!((250..=500).contains(&report.requests), "{report}");
    // Zipf's hottest users pass the nested rule's 5 per hour quickly.
    assert!(report.over_limit > 0 && report.ok > 0, "{report}");
    let service = report.service_time.expect("a fixed rate reports service time");
    assert!(report.latency.max >= service.max, "{report}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remaining_reads_without_consuming() {
    let server = TestServer::start(limiter(CONFIG, memory()).0).await;
    let remaining = ["--api", "remaining", "--duration", "500ms", "--concurrency", "4"];
    let before = bench(&server, &remaining).await;
    assert_all_checked(&before);
    assert_eq!(before.ok, before.requests, "nothing consumed yet\n{before}");

    let spent = bench(&server, &["--api", "envoy", "--duration", "500ms"]).await;
    assert_all_checked(&spent);
    assert_eq!(spent.ok, 50, "GetRemaining consumed nothing\n{spent}");

    let after = bench(&server, &remaining).await;
    assert_all_checked(&after);
    assert_eq!(after.over_limit, after.requests, "the hot key is spent\n{after}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_is_sent_but_not_counted() {
    let server = TestServer::start(limiter(CONFIG, memory()).0).await;
    let report = bench(
        &server,
        &["--warmup", "500ms", "--duration", "500ms", "--concurrency", "4"],
    )
    .await;
    assert_all_checked(&report);
    assert_eq!(report.ok, 0, "the warm-up spent the 50 hits\n{report}");
    assert_eq!(report.setup.warmup, std::time::Duration::from_millis(500));
    server.shutdown().await;
}

/// A failed call is counted by its gRPC code (here a rejected request, answered with trailers only),
/// and the run does not pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_are_counted_by_code() {
    let server = TestServer::start(limiter(CONFIG, memory()).0).await;
    // 65 descriptors exceed the default cap of 64: INVALID_ARGUMENT for every request.
    let report = bench(
        &server,
        &["--duration", "300ms", "--concurrency", "4", "--descriptors", "65"],
    )
    .await;
    assert!(report.requests > 0, "\n{report}");
    assert_eq!(
        report.errors,
        vec![(tonic::Code::InvalidArgument, report.requests)],
        "\n{report}"
    );
    assert_eq!(report.ok + report.over_limit + report.failed_checks, 0);
    assert!(!report.passed());
    // With the server gone, the load cannot even connect.
    let target = server.grpc_url();
    server.shutdown().await;
    let args = Cli::try_parse_from(["bench", "--target", &target, "--quiet", "--duration", "300ms"])
        .unwrap()
        .args;
    assert!(bench::run(args).await.is_err(), "nothing listens any more");
}
