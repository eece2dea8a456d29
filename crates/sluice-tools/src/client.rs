//! `sluice-client`: one call from the command line, like the reference's `ratelimit_client`.
//!
//! `sluice-client --domain edge --descriptor path=/login --descriptor user=42` sends one request with two
//! descriptors (each `--descriptor` is one descriptor; `key=value,key2=value2` gives it several entries) and prints
//! the answer, one line per descriptor. `--remaining` asks GetRemaining instead; `--release LEASE` ends a lease.
//! The cost-budget calls: `--check COST`, `--report COST`, `--reserve ESTIMATE` (prints the reservation id) and
//! `--settle RESERVATION_ID --actual COST`, each with named costs from `--cost name=value`.
//!
//! Lists and offenders (admin calls: `--admin-token`, or `SLUICE_ADMIN_TOKEN`): `--list NAME` prints a list's run-time
//! entries, with `--add VALUE…` (and `--ttl SECONDS`) or `--remove VALUE…` it changes them; `--offenders minute|hour`
//! prints each rule's values hit and denied most (`--limit N`).

use std::collections::HashMap;
use std::process::ExitCode;

use tonic::transport::{Channel, Endpoint};

use crate::proto::envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit::Unit};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::sluice::v1::get_top_offenders_request::Span;
use crate::proto::sluice::v1::rate_limiter_client::RateLimiterClient;
use crate::proto::sluice::v1::{
    CostRequest, DescriptorRemaining, GetListEntriesRequest, GetRemainingRequest, GetTopOffendersRequest,
    ListEntriesRequest, ReleaseRequest, ReserveRequest, SettleRequest,
};

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
    #[arg(long = "descriptor", required_unless_present_any = ["list", "offenders"], value_parser = parse_descriptor)]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// The admin token, for --list and --offenders.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A deny or allow list of the domain: prints its run-time entries, or changes them with --add or --remove.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["descriptors", "offenders"])]
    pub list: Option<String>,
    /// Values to add to --list (addresses, CIDR ranges, exact values, `*` patterns); repeatable. With --ttl they
    /// expire.
    #[arg(long, value_name = "VALUE", requires = "list", conflicts_with = "remove")]
    pub add: Vec<String>,
    /// Values to remove from --list's run-time entries; repeatable.
    #[arg(long, value_name = "VALUE", requires = "list")]
    pub remove: Vec<String>,
    /// Per rule of the domain, the values hit most and denied most over the last `minute` or `hour`.
    #[arg(long, value_name = "SPAN", value_parser = ["minute", "hour"], conflicts_with = "descriptors")]
    pub offenders: Option<String>,
    /// How many rules, and values per rule, --offenders prints.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000), requires = "offenders")]
    pub limit: u32,
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
    /// How long a reservation holds (with --reserve; the server's default otherwise) or added list values stay (with
    /// --add; for good otherwise), in seconds.
    #[arg(long, value_name = "SECONDS")]
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

/// The client of sluice's own gRPC API (everything but ShouldRateLimit), over the connection a call opens.
type Limiter = RateLimiterClient<Channel>;

/// Connects to `--target`, rejects `--ttl` without a flag it applies to, and makes the one call the flags ask for.
/// Errors come back as the line `main` prints.
async fn call(args: ClientArgs) -> Result<ExitCode, String> {
    let channel = connect(&args.target).await?;
    if args.ttl.is_some() && args.reserve.is_none() && args.add.is_empty() {
        return Err("--ttl goes with --reserve or --add".into());
    }
    dispatch(channel, args).await.map_err(rpc_error)
}

/// Opens the connection to `target`, naming the target when it is not a URL or does not answer.
async fn connect(target: &str) -> Result<Channel, String> {
    Endpoint::from_shared(target.to_string())
        .map_err(|e| format!("--target '{target}': {e}"))?
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {target}: {e}"))
}

/// A failed call as its gRPC code and the server's message, e.g. `PermissionDenied: ...`.
fn rpc_error(status: tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Picks the call the flags ask for and makes it. clap rejects most combinations; for those it lets through (such as
/// `--release` with `--check`) the order here decides: the admin calls, a lease's end, the cost-budget calls,
/// GetRemaining, and, when no flag names a call, Envoy's ShouldRateLimit.
async fn dispatch(channel: Channel, args: ClientArgs) -> Result<ExitCode, tonic::Status> {
    let limiter = RateLimiterClient::new(channel.clone());
    if let Some(list) = args.list.clone() {
        return lists(limiter, args, list).await;
    }
    if let Some(span) = args.offenders.clone() {
        return offenders(limiter, args, &span).await;
    }
    if let Some(lease_id) = args.release.clone() {
        return release(limiter, args, lease_id).await;
    }
    if let Some(cost) = args.check.or(args.report) {
        return check_or_report(limiter, args, cost).await;
    }
    if let Some(estimate) = args.reserve {
        return reserve(limiter, args, estimate).await;
    }
    if let Some(reservation_id) = args.settle.clone() {
        return settle(limiter, args, reservation_id).await;
    }
    if let Some(cost) = args.remaining {
        return remaining(limiter, args, cost).await;
    }
    should_rate_limit(RateLimitServiceClient::new(channel), args).await
}

/// The `--cost name=value` flags as the map the cost-budget requests carry; a name given twice keeps its last value.
fn named_costs(costs: &[(String, u64)]) -> HashMap<String, u64> {
    costs.iter().cloned().collect()
}

/// `--ttl` as the protobuf duration the reservation and list requests carry.
fn ttl_duration(ttl: Option<u32>) -> Option<prost_types::Duration> {
    ttl.map(|s| prost_types::Duration {
        seconds: i64::from(s),
        nanos: 0,
    })
}

/// `--release`: ends a concurrency lease, so its slot frees now rather than when the lease would expire.
async fn release(mut limiter: Limiter, args: ClientArgs, lease_id: String) -> Result<ExitCode, tonic::Status> {
    let request = ReleaseRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        lease_id,
    };
    let answer = limiter.release(request).await?;
    println!("released {}", answer.into_inner().released);
    Ok(ExitCode::SUCCESS)
}

/// `--check` (decide `cost` without counting it) or `--report` (count it whatever the limits say); prints the
/// decision as ShouldRateLimit's is printed, and exits by it.
async fn check_or_report(mut limiter: Limiter, args: ClientArgs, cost: u64) -> Result<ExitCode, tonic::Status> {
    let check = args.check.is_some();
    let request = CostRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        cost: Some(cost),
        costs: named_costs(&args.costs),
    };
    let answer = if check {
        limiter.check(request).await
    } else {
        limiter.report(request).await
    }?
    .into_inner();
    print_decision(&answer);
    Ok(exit_code(answer.overall_code))
}

/// `--reserve`: admits and holds an estimated cost; prints the decision and, when admitted, the reservation id that
/// `--settle` takes and how long it holds.
async fn reserve(mut limiter: Limiter, args: ClientArgs, estimate: u64) -> Result<ExitCode, tonic::Status> {
    let request = ReserveRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        estimate: Some(estimate),
        estimates: named_costs(&args.costs),
        ttl: ttl_duration(args.ttl),
    };
    let answer = limiter.reserve(request).await?.into_inner();
    print_decision(&RateLimitResponse {
        overall_code: answer.overall_code,
        statuses: answer.statuses,
        ..Default::default()
    });
    if !answer.reservation_id.is_empty() {
        let ttl = answer.ttl.map_or(0, |t| t.seconds);
        println!("reservation {} for {ttl}s", answer.reservation_id);
    }
    Ok(exit_code(answer.overall_code))
}

/// `--settle`: replaces a reservation's estimate with `--actual` and prints, per descriptor, what was charged and
/// refunded. Exits 2 when the reservation is gone, since the actual cost was then not applied.
async fn settle(mut limiter: Limiter, args: ClientArgs, reservation_id: String) -> Result<ExitCode, tonic::Status> {
    let request = SettleRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        reservation_id,
        actual: args.actual,
        actuals: named_costs(&args.costs),
    };
    let answer = limiter.settle(request).await?.into_inner();
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
    Ok(ExitCode::SUCCESS)
}

/// `--remaining`: asks, without counting anything, what a hit of `cost` would leave; prints one line per descriptor.
/// Exits 0 whatever the answer, since nothing was decided.
async fn remaining(mut limiter: Limiter, args: ClientArgs, cost: u64) -> Result<ExitCode, tonic::Status> {
    let request = GetRemainingRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        cost: Some(cost),
    };
    let answer = limiter.get_remaining(request).await?;
    for (i, d) in answer.into_inner().descriptors.iter().enumerate() {
        println!("descriptor {i}: {}", remaining_line(d));
    }
    Ok(ExitCode::SUCCESS)
}

/// One descriptor's GetRemaining answer in words: no rule, unlimited, or what is left of its limit and when a
/// denied hit could retry.
fn remaining_line(d: &DescriptorRemaining) -> String {
    match (&d.limit, d.matched, d.unlimited) {
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
    }
}

/// Without a flag naming another call: Envoy's ShouldRateLimit, the counted decision a proxy would get.
async fn should_rate_limit(
    mut client: RateLimitServiceClient<Channel>,
    args: ClientArgs,
) -> Result<ExitCode, tonic::Status> {
    let request = RateLimitRequest {
        domain: args.domain,
        descriptors: args.descriptors,
        hits_addend: args.hits_addend,
    };
    let answer = client.should_rate_limit(request).await?.into_inner();
    print_decision(&answer);
    Ok(exit_code(answer.overall_code))
}

/// `message` with the admin token, when one is given.
fn admin<T>(message: T, token: Option<&str>) -> Result<tonic::Request<T>, tonic::Status> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("--admin-token holds characters a header may not"))?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// `--list`: adds, removes, or prints a list's run-time entries.
async fn lists(mut client: Limiter, args: ClientArgs, list: String) -> Result<ExitCode, tonic::Status> {
    let token = args.admin_token.as_deref();
    let change = |values: Vec<String>| ListEntriesRequest {
        domain: args.domain.clone(),
        list: list.clone(),
        values,
        ttl: ttl_duration(args.ttl),
    };
    if !args.add.is_empty() {
        let answer = client.add_list_entries(admin(change(args.add.clone()), token)?).await?;
        println!("added {}", answer.into_inner().changed);
        return Ok(ExitCode::SUCCESS);
    }
    if !args.remove.is_empty() {
        let answer = client
            .remove_list_entries(admin(change(args.remove.clone()), token)?)
            .await?;
        println!("removed {}", answer.into_inner().changed);
        return Ok(ExitCode::SUCCESS);
    }
    let request = GetListEntriesRequest {
        domain: args.domain.clone(),
        list,
    };
    for entry in client
        .get_list_entries(admin(request, token)?)
        .await?
        .into_inner()
        .entries
    {
        match entry.expires_in {
            Some(left) => println!("{} expires in {}s", entry.value, left.seconds),
            None => println!("{}", entry.value),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--offenders`: each rule's values hit and denied most.
async fn offenders(mut client: Limiter, args: ClientArgs, span: &str) -> Result<ExitCode, tonic::Status> {
    let span = if span == "hour" { Span::Hour } else { Span::Minute };
    let request = GetTopOffendersRequest {
        domain: args.domain,
        span: span as i32,
        limit: args.limit,
    };
    let answer = client
        .get_top_offenders(admin(request, args.admin_token.as_deref())?)
        .await?;
    for rule in answer.into_inner().rules {
        println!("rule {}", rule.rule);
        for (kind, list) in [("hits", &rule.hits), ("denied", &rule.denied)] {
            for o in list {
                println!("  {kind:<6} {} {}", o.count, o.value);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
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
            // Only a deny list answers OVER_LIMIT without a limit (its header names it).
            None if s.code == Code::OverLimit as i32 => ", denied by a list".to_string(),
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
