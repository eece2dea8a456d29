//! `sluice-empty`: a `ShouldRateLimit` server with nothing behind it, the yardstick of what sluice's own work costs.
//!
//! It is served exactly as `sluice serve` serves Envoy's rate limit service (the same allocator, the same runtime and
//! serving threads, the same listener and HTTP/2 connections, the same tonic codec and prost messages), and answers
//! every call OK with one OK status per descriptor, keeping no state. `benches/empty.sh` drives it and sluice in
//! memory with the same load and compares their CPU time per decision.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use sluice::proto::envoy::service::ratelimit::v3 as rls;
use sluice::server::grpc::{self, Routes as _};
use tonic::{Request, Response, Status};

/// The allocator `sluice` serves with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Serves Envoy's rate limit service, answering every call OK with nothing behind it.
#[derive(Debug, Parser)]
#[command(name = "sluice-empty", version)]
struct Args {
    /// The address to serve gRPC on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,
    /// Serving threads, as `sluice serve --worker-threads` takes them (0: as sluice sizes itself).
    #[arg(long, default_value_t = 0)]
    worker_threads: usize,
}

/// Every call OK, one OK status per descriptor.
#[derive(Debug, Clone, Copy)]
struct Empty;

#[tonic::async_trait]
impl rls::rate_limit_service_server::RateLimitService for Empty {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let ok = rls::rate_limit_response::Code::Ok as i32;
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| rls::rate_limit_response::DescriptorStatus {
                code: ok,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(rls::RateLimitResponse {
            overall_code: ok,
            statuses,
            ..Default::default()
        }))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (runtime, _) = match sluice::server::runtime(args.worker_threads) {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sluice-empty: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind(args.grpc_addr).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("sluice-empty: cannot listen on {}: {e}", args.grpc_addr);
                return ExitCode::FAILURE;
            }
        };
        let incoming = match sluice::operations::tls::incoming(listener, None) {
            Ok(incoming) => incoming,
            Err(e) => {
                eprintln!("sluice-empty: {e}");
                return ExitCode::FAILURE;
            }
        };
        let routes = grpc::Unimplemented.add(rls::rate_limit_service_server::RateLimitServiceServer::new(Empty));
        grpc::serve(routes, incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
        ExitCode::SUCCESS
    })
}
