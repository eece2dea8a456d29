//! `sluice-client`: one call from the command line, like the reference's `ratelimit_client`.
//!
//! `sluice-client --domain edge --descriptor path=/login --descriptor user=42` sends one request with two
//! descriptors (each `--descriptor` is one descriptor; `key=value,key2=value2` gives it several entries) and prints
//! the answer, one line per descriptor. `--remaining` asks GetRemaining instead; `--release LEASE` ends a lease.
//! The cost-budget calls: `--check COST`, `--report COST`, `--reserve ESTIMATE` (prints the reservation id) and
//! `--settle RESERVATION_ID --actual COST`, each with named costs from `--cost name=value`.

use std::process::ExitCode;

use crate::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::sluice::v1::rate_limiter_client::RateLimiterClient;
use crate::proto::sluice::v1::{CostRequest, GetRemainingRequest, ReleaseRequest, ReserveRequest, SettleRequest};

/// The flags of `sluice-client`.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The sluice gRPC address.
    #[arg(long, env = "SLUICE_TARGET", default_value = "http://127.0.0.1:8081")]
    pub target: String,
    /// The rate limit domain.
    #[arg(long)]
    pub domain: String,
    /// One descriptor: `key=value[,key=value...]`. Repeat for several descriptors.
    #[arg(long = "descriptor", required = true, value_parser = parse_descriptor)]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// The request's cost (hits_addend); 0 means 1.
    #[arg(long, default_value_t = 0)]
    pub hits_addend: u32,
    /// Ask GetRemaining (read-only) instead of ShouldRateLimit, for a hit of this cost.
    #[arg(long, value_name = "COST", num_args = 0..=1, default_missing_value = "1")]
    pub remaining: Option<u64>,
    /// End this concurrency lease instead of asking for a decision.
    #[arg(long, value_name = "LEASE_ID", conflicts_with = "remaining")]
    pub release: Option<String>,
    /// Check: decide this cost without counting it.
    #[arg(long, value_name = "COST", group = "budget")]
    pub check: Option<u64>,
    /// Report: count this cost whatever the limits say.
    #[arg(long, value_name = "COST", group = "budget")]
    pub report: Option<u64>,
    /// Reserve: admit and hold this estimated cost; prints the reservation id.
    #[arg(long, value_name = "ESTIMATE", group = "budget")]
    pub reserve: Option<u64>,
    /// How long a reservation holds, in seconds (with --reserve; the server's default otherwise).
    #[arg(long, value_name = "SECONDS", requires = "reserve")]
    pub ttl: Option<u32>,
    /// Settle: replace this reservation's estimate with --actual.
    #[arg(long, value_name = "RESERVATION_ID", group = "budget", requires = "actual")]
    pub settle: Option<String>,
    /// The actual cost, with --settle.
    #[arg(long, value_name = "COST", requires = "settle")]
    pub actual: Option<u64>,
    /// A named cost, `name=value` (e.g. input_tokens=1200), for limits configured with `cost:` or `price:`; repeatable.
    #[arg(long = "cost", value_name = "NAME=VALUE", value_parser = parse_named_cost)]
    pub costs: Vec<(String, u64)>,
}

fn parse_named_cost(text: &str) -> Result<(String, u64), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => value
            .parse::<u64>()
            .map(|v| (name.to_string(), v))
            .map_err(|_| format!("'{value}' is not a whole number from 0 to {}", u64::MAX)),
        _ => Err(format!("'{text}' is not name=value")),
    }
}

fn parse_descriptor(text: &str) -> Result<RateLimitDescriptor, String> {
    let entries = text
        .split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok(Entry {
                key: key.to_string(),
                value: value.to_string(),
            }),
            _ => Err(format!("'{pair}' is not key=value")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        ..Default::default()
    })
}

/// Runs one call and prints the answer. Exits 0 for OK, 2 for OVER_LIMIT, 1 for an error.
pub fn main(args: ClientArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(call(args)) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn call(args: ClientArgs) -> Result<ExitCode, String> {
    let channel = tonic::transport::Endpoint::from_shared(args.target.clone())
        .map_err(|e| format!("--target '{}': {e}", args.target))?
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", args.target))?;
    let rpc_error = |e: tonic::Status| format!("{:?}: {}", e.code(), e.message());
    if let Some(lease_id) = args.release {
        let request = ReleaseRequest {
            domain: args.domain,
            descriptors: args.descriptors,
            lease_id,
        };
        let answer = RateLimiterClient::new(channel)
            .release(request)
            .await
            .map_err(rpc_error)?;
        println!("released {}", answer.into_inner().released);
        return Ok(ExitCode::SUCCESS);
    }
    let mut limiter = RateLimiterClient::new(channel.clone());
    let named: std::collections::HashMap<String, u64> = args.costs.iter().cloned().collect();
    if let Some(cost) = args.check.or(args.report) {
        let request = CostRequest {
            domain: args.domain,
            descriptors: args.descriptors,
            cost: Some(cost),
            costs: named,
        };
        let answer = if args.check.is_some() {
            limiter.check(request).await
        } else {
            limiter.report(request).await
        }
        .map_err(rpc_error)?
        .into_inner();
        print_decision(&answer);
        return Ok(exit_code(answer.overall_code));
    }
    if let Some(estimate) = args.reserve {
        let request = ReserveRequest {
            domain: args.domain,
            descriptors: args.descriptors,
            estimate: Some(estimate),
            estimates: named,
            ttl: args.ttl.map(|s| prost_types::Duration {
                seconds: i64::from(s),
                nanos: 0,
            }),
        };
        let answer = limiter.reserve(request).await.map_err(rpc_error)?.into_inner();
        print_decision(&RateLimitResponse {
            overall_code: answer.overall_code,
            statuses: answer.statuses,
            ..Default::default()
        });
        if !answer.reservation_id.is_empty() {
            let ttl = answer.ttl.map_or(0, |t| t.seconds);
            println!("reservation {} for {ttl}s", answer.reservation_id);
        }
        return Ok(exit_code(answer.overall_code));
    }
    if let Some(reservation_id) = args.settle {
        let request = SettleRequest {
            domain: args.domain,
            descriptors: args.descriptors,
            reservation_id,
            actual: args.actual,
            actuals: named,
        };
        let answer = limiter.settle(request).await.map_err(rpc_error)?.into_inner();
        if !answer.settled {
            println!("no such reservation (expired and charged at its estimate, settled already, or unknown)");
            return Ok(ExitCode::from(2));
        }
        for (i, s) in answer.settlements.iter().enumerate() {
            println!(
                "descriptor {i}: estimate {}, actual {}, charged {}, refunded {}",
                s.estimate, s.actual, s.charged, s.refunded
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(cost) = args.remaining {
        let request = GetRemainingRequest {
            domain: args.domain,
            descriptors: args.descriptors,
            cost: Some(cost),
        };
        let answer = limiter.get_remaining(request).await.map_err(rpc_error)?;
        for (i, d) in answer.into_inner().descriptors.iter().enumerate() {
            let line = match (&d.limit, d.matched, d.unlimited) {
                (_, false, _) => "no rule".to_string(),
                (_, true, true) => "unlimited".to_string(),
                (None, true, false) => "limited".to_string(),
                (Some(l), true, false) => {
                    let retry = match (&d.retry_after, d.never) {
                        (_, true) => "never".to_string(),
                        (Some(r), _) => format!("{:.3}s", r.seconds as f64 + f64::from(r.nanos) / 1e9),
                        (None, _) => "?".to_string(),
                    };
                    let name = if l.name.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", l.name)
                    };
                    format!(
                        "{} of {} per {} {} ({}{name}), retry after {retry}{}",
                        d.remaining,
                        l.requests_per_unit,
                        l.unit_multiplier,
                        unit_name(l.unit),
                        l.algorithm,
                        if d.records.is_empty() {
                            String::new()
                        } else {
                            format!(", records {:?}", d.records)
                        },
                    )
                }
            };
            println!("descriptor {i}: {line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let request = RateLimitRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        hits_addend: args.hits_addend,
    };
    let answer = RateLimitServiceClient::new(channel)
        .should_rate_limit(request)
        .await
        .map_err(rpc_error)?
        .into_inner();
    print_decision(&answer);
    Ok(exit_code(answer.overall_code))
}

/// 0 for OK, 2 for OVER_LIMIT.
fn exit_code(overall: i32) -> ExitCode {
    if overall == Code::OverLimit as i32 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

fn unit_name(unit: i32) -> &'static str {
    Unit::try_from(unit).unwrap_or(Unit::Unknown).as_str_name()
}

fn print_decision(answer: &RateLimitResponse) {
    let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
    println!("overall: {}", code(answer.overall_code));
    for (i, s) in answer.statuses.iter().enumerate() {
        let limit = match &s.current_limit {
            Some(l) => {
                let name = if l.name.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", l.name)
                };
                let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
                format!(
                    ", {} of {} per {} left{name}, resets in {reset}s",
                    s.limit_remaining,
                    l.requests_per_unit,
                    unit_name(l.unit)
                )
            }
            None if s.limit_remaining == u32::MAX => ", unlimited".to_string(),
            None => ", no rule".to_string(),
        };
        println!("descriptor {i}: {}{limit}", code(s.code));
    }
    for h in &answer.response_headers_to_add {
        println!("header {}: {}", h.key, h.value);
    }
    if let Some(metadata) = &answer.dynamic_metadata {
        println!(
            "metadata: {}",
            crate::json::response(&RateLimitResponse {
                dynamic_metadata: Some(metadata.clone()),
                ..Default::default()
            })["dynamicMetadata"]
        );
    }
}
