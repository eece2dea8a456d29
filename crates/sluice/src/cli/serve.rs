//! `sluice serve`: its flags, gathered from their groups, with the process's own (threads, grace period, the
//! compatibility mode); the settings they make; and the server they start, stopped by SIGTERM or SIGINT.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::cli::answers::AnswerFlags;
use crate::cli::caps::CapFlags;
use crate::cli::environment::{self, Translation};
use crate::cli::listeners::ListenerFlags;
use crate::cli::regions::RegionFlags;
use crate::cli::rules::{RuleFlags, domains};
use crate::cli::storage::StorageFlags;
use crate::cli::telemetry::TelemetryFlags;
use crate::limiter::LimiterSettings;
use crate::operations::telemetry;
use crate::server::{self, ServeOptions, Settings};

/// `sluice serve`'s flags.
#[derive(Debug, Args)]
pub(super) struct ServeArgs {
    #[command(flatten)]
    rules: RuleFlags,
    #[command(flatten)]
    listeners: ListenerFlags,
    #[command(flatten)]
    storage: StorageFlags,
    #[command(flatten)]
    regions: RegionFlags,
    #[command(flatten)]
    caps: CapFlags,
    #[command(flatten)]
    answers: AnswerFlags,
    #[command(flatten)]
    telemetry: TelemetryFlags,
    /// Threads that serve requests (0: one per CPU the process may use, its cgroup's quota included, but a single
    /// one with two CPUs or fewer). Where sluice shares its cores with Redis or other busy processes, fewer threads
    /// cost less CPU per decision; 1 is the cheapest (one scheduler that batches answers).
    #[arg(long, env = "SLUICE_WORKER_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1024))]
    worker_threads: u64,
    /// Seconds in-flight calls may take to finish after SIGTERM/SIGINT.
    #[arg(long, env = "SLUICE_GRACE_PERIOD_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3_600))]
    grace_period_secs: u64,
    /// Read the environment variables of another rate limit service: `envoy-ratelimit` reads envoyproxy/ratelimit's
    /// (docs/src/migration.md). Also on when the binary runs as `ratelimit`.
    #[arg(long, env = "SLUICE_COMPAT", value_parser = [environment::MODE])]
    compat: Option<String>,
}

/// Sets up the logs and traces, then serves until SIGTERM or SIGINT; `compat` is what the compatibility mode read.
pub(super) fn serve(args: ServeArgs, compat: Option<Translation>) -> ExitCode {
    // Dropped when `serve` returns, after the server has drained: that flushes the last spans.
    let _telemetry = match telemetry::init(&args.telemetry.settings()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(t) = &compat {
        tracing::info!(read = ?t.read, "envoy-ratelimit compatibility: the reference's variables read");
        for (variable, why) in &t.ignored {
            tracing::warn!(variable, why, "envoy-ratelimit compatibility: variable ignored");
        }
    }
    if let Err(e) = args.regions.check() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match server::runtime(args.worker_threads as usize) {
        Ok((rt, threads)) => {
            tracing::info!(threads, "runtime started");
            rt
        }
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The signals are listened for before anything binds: a SIGTERM that comes as soon as the ports answer drains the
    // server instead of killing it.
    match runtime.block_on(async { server::run(settings(args), shutdown_signal()).await }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "sluice stopped");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Everything the server is told, from the flags.
fn settings(args: ServeArgs) -> Settings {
    let ServeArgs {
        rules,
        listeners,
        storage,
        regions,
        caps,
        answers,
        telemetry,
        grace_period_secs,
        ..
    } = args;
    Settings {
        domains: domains(rules.merge_domains),
        rules: rules.source(),
        grpc_addr: listeners.grpc_addr,
        http_addr: listeners.http_addr,
        json_addr: listeners.json_addr,
        metrics: listeners.metrics(),
        redis: storage.redis(),
        regions: regions.regions(),
        limiter: LimiterSettings {
            key_prefix: storage.key_prefix.clone(),
            key_layout: storage.key_layout.into(),
            shadow_mode: answers.shadow_mode,
            response_metadata: answers.response_metadata,
            failure_policy: storage.failure_policy.into(),
            breaker: storage.breaker(),
            local_cache_size: storage.local_cache_size,
            caps: caps.request(),
            max_waiters: caps.max_waiters as usize,
            top_offenders: telemetry.top_offenders as usize,
        },
        near_limit_ratio: telemetry.near_limit_ratio,
        serve: ServeOptions {
            grace_period: Duration::from_secs(grace_period_secs),
            admin_token: listeners.admin_token(),
            tls: listeners.tls(),
            response_headers: answers.headers(),
            quota_caps: caps.quota(),
        },
    }
}

/// Resolves on SIGTERM or SIGINT. Both are listened for from the call on, not from the first poll, so that none is
/// missed (and left to kill the process) while the server starts. Called inside the runtime.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    let received = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
        match s {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    async move {
        tokio::select! {
            _ = received(term) => tracing::info!("SIGTERM received"),
            _ = received(int) => tracing::info!("SIGINT received"),
        }
    }
}
