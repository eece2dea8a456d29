//! `sluice-bench`: a load generator that speaks sluice's two gRPC APIs over real connections and reports
//! throughput, answers and latency percentiles.
//!
//! h2load (see TOOLS.md) sends one fixed body and never reads `grpc-status`, so it can neither spread load over
//! many counters nor tell a right answer from a wrong one. This generator draws descriptor values from a key
//! distribution, checks every answer (a known code, one status per descriptor sent), counts failures by gRPC code,
//! and at a fixed rate measures latency from each request's scheduled send time, so that a stalled server cannot
//! hide behind the requests it delayed (coordinated omission).
//!
//! - [`keys`]: key distributions and the small random number generator behind them.
//! - `load`: connections, request slots, the answer checks and the tallies.
//! - `pace`: the thread that releases the requests of a fixed rate at their scheduled times.
//! - `report`: percentiles, the human table and the JSON object.
//! - `wire`: unary gRPC calls straight over HTTP/2 streams, a far cheaper client than tonic's.

pub mod keys;
mod load;
mod pace;
mod report;
mod wire;

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Endpoint;

use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
pub use keys::KeySpec;
use keys::Keys;
pub use load::CheckFailure;
use load::{Client, Plan, Schedule, Shape, Tally};
use pace::Pacer;
pub use report::{Percentiles, Report};

/// The longest `--duration`, `--warmup` or `--timeout`.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3_600);

/// The highest `--rate`: beyond it a schedule's spacing is below what a timer or a 2-core machine can honour.
const MAX_RATE: f64 = 10_000_000.0;

/// Which RPC the load calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
    Envoy,
    /// sluice.v1.RateLimiter/ShouldRateLimit
    Sluice,
    /// sluice.v1.RateLimiter/GetRemaining (read-only)
    Remaining,
}

impl Api {
    /// The name `--api` takes.
    pub fn name(self) -> &'static str {
        match self {
            Api::Envoy => "envoy",
            Api::Sluice => "sluice",
            Api::Remaining => "remaining",
        }
    }

    /// The full gRPC method.
    pub fn rpc(self) -> &'static str {
        match self {
            Api::Envoy => "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            Api::Sluice => "sluice.v1.RateLimiter/ShouldRateLimit",
            Api::Remaining => "sluice.v1.RateLimiter/GetRemaining",
        }
    }
}

/// The flags of `sluice-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The sluice gRPC address (plaintext HTTP/2).
    #[arg(long, default_value = "http://127.0.0.1:8081", value_parser = parse_target)]
    pub target: String,
    /// The RPC to call.
    #[arg(long, value_enum, default_value_t = Api::Envoy)]
    pub api: Api,
    /// Separate HTTP/2 connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1_024))]
    pub connections: u32,
    /// Threads of the load generator. One keeps its cost per request lowest (like h2load's default), which matters
    /// when it shares the machine with the server it measures.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_024))]
    pub threads: u32,
    /// Requests in flight at most, in total, spread evenly over the connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub concurrency: u32,
    /// Requests per second on a fixed schedule (open loop; latency counts from the scheduled send time).
    /// Without it, each request slot sends as soon as its previous answer arrives (closed loop, max throughput).
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<f64>,
    /// How long to measure, e.g. 500ms, 10s, 2m.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub duration: Duration,
    /// Load sent before measuring starts, not counted (e.g. 2s).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// The rate limit domain of every request.
    #[arg(long, default_value = "edge", value_parser = parse_non_empty)]
    pub domain: String,
    /// Where descriptor values come from, as decimal numbers: hot (always 0), uniform:N (0 to N-1 equally) or
    /// zipf:N[:S] (0 most often, with exponent S, default 1).
    #[arg(long, default_value = "hot", value_parser = KeySpec::parse)]
    pub keys: KeySpec,
    /// Descriptors per request, each with its own drawn value.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub descriptors: u32,
    /// The key of the drawn entry of every descriptor.
    #[arg(long, default_value = "user", value_parser = parse_non_empty)]
    pub descriptor_key: String,
    /// An entry put before the drawn one in every descriptor, to reach nested rules (e.g. path=/api/v1);
    /// repeatable, in order.
    #[arg(long = "parent-entry", value_name = "KEY=VALUE", value_parser = parse_entry)]
    pub parent_entries: Vec<(String, String)>,
    /// The request's hits_addend (ShouldRateLimit) or cost (GetRemaining); unset means 1.
    #[arg(long)]
    pub hits_addend: Option<u32>,
    /// A request not answered within this counts as DEADLINE_EXCEEDED.
    #[arg(long, default_value = "5s", value_parser = parse_positive_duration)]
    pub timeout: Duration,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub quiet: bool,
    /// Exit 0 even if some requests failed or got wrong answers.
    #[arg(long)]
    pub allow_errors: bool,
}

/// Why a run could not take place. Failed requests are not errors: the report counts them.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Flags that are valid alone but not together.
    #[error("{flag}: {message}")]
    Flag { flag: &'static str, message: String },
    #[error("cannot connect to --target '{target}': {reason}")]
    Connect { target: String, reason: String },
    #[error("cannot start the runtime or the pacer thread: {0}")]
    Runtime(std::io::Error),
    /// A request slot panicked: a bug in the generator.
    #[error("a request slot stopped: {0}")]
    Slot(String),
}

impl BenchError {
    /// 2 for misuse, as clap does for a bad flag; 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            BenchError::Flag { .. } => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// The load's runtime: the current-thread scheduler for one thread (the default: the generator takes less of the
/// machine it measures), else a multi-thread one of `threads` workers (0: one per CPU).
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    use tokio::runtime::Builder;
    let mut builder = if threads == 1 {
        Builder::new_current_thread()
    } else {
        Builder::new_multi_thread()
    };
    if threads > 1 {
        builder.worker_threads(threads);
    }
    builder.enable_all().build()
}

/// Runs `sluice-bench`: builds a runtime, runs the load, prints the report. Exits 1 if any request failed or got
/// a wrong answer (unless `--allow-errors`), 2 for flags that do not go together.
pub fn main(args: BenchArgs) -> ExitCode {
    let (json, allow_errors) = (args.json, args.allow_errors);
    let runtime = match runtime(args.threads as usize) {
        Ok(rt) => rt,
        Err(e) => {
            let e = BenchError::Runtime(e);
            eprintln!("error: {e}");
            return e.exit_code();
        }
    };
    let report = match runtime.block_on(run(args)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return e.exit_code();
        }
    };
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
    if report.passed() || allow_errors {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: {} of {} requests failed ({} wrong answers, {} gRPC errors); --allow-errors accepts this",
            report.failed_checks + report.error_count(),
            report.requests,
            report.failed_checks,
            report.error_count()
        );
        ExitCode::FAILURE
    }
}

/// Connects, runs the load for the warm-up and the measured duration, and reports what was measured.
pub async fn run(args: BenchArgs) -> Result<Report, BenchError> {
    if args.concurrency < args.connections {
        return Err(BenchError::Flag {
            flag: "--concurrency",
            message: format!(
                "{} is less than --connections {}: every connection needs at least one request in flight",
                args.concurrency, args.connections
            ),
        });
    }
    let target: http::Uri = args.target.parse().map_err(|e| BenchError::Flag {
        flag: "--target",
        message: format!("'{}' is not a URL: {e}", args.target),
    })?;
    let channels = connect(&args.target, &target, args.connections).await?;
    let schedule = args.rate.map(|rate| Schedule::new(rate, args.warmup, args.duration));
    let shape = Arc::new(Shape {
        domain: args.domain.clone(),
        parent_entries: args
            .parent_entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        descriptor_key: args.descriptor_key.clone(),
        descriptors: args.descriptors as usize,
        hits_addend: args.hits_addend,
        keys: Keys::new(args.keys),
    });
    let tallies: Vec<Arc<Mutex<Tally>>> = channels.iter().map(|_| Arc::new(Mutex::new(Tally::new()))).collect();

    let start = Instant::now();
    let pacer = schedule
        .map(|s| Pacer::start(s, start, u64::from(args.concurrency)))
        .transpose()
        .map_err(BenchError::Runtime)?;
    let plan = Arc::new(Plan {
        start,
        measure_from: start + args.warmup,
        deadline: start + args.warmup + args.duration,
        pacer,
        timeout: args.timeout,
    });
    let progress = Progress::start(args.quiet, plan.clone(), tallies.clone());
    let mut slots = JoinSet::new();
    for slot in 0..args.concurrency as usize {
        let connection = slot % channels.len();
        slots.spawn(load::drive(
            slot as u64,
            Client::new(args.api, channels[connection].clone(), &target).map_err(|e| BenchError::Flag {
                flag: "--target",
                message: format!("'{}' cannot address a method: {e}", args.target),
            })?,
            shape.clone(),
            tallies[connection].clone(),
            plan.clone(),
        ));
    }
    let mut stopped = None;
    while let Some(joined) = slots.join_next().await {
        if let Err(e) = joined {
            stopped.get_or_insert(e.to_string());
        }
    }
    let elapsed = plan.measure_from.elapsed();
    progress.finish();
    if let Some(reason) = stopped {
        return Err(BenchError::Slot(reason));
    }

    let mut total = Tally::new();
    for tally in &tallies {
        total.merge(&load::lock(tally));
    }
    let setup = report::Setup {
        target: args.target,
        api: args.api,
        domain: args.domain,
        keys: args.keys,
        descriptors: args.descriptors,
        descriptor_key: args.descriptor_key,
        connections: args.connections,
        concurrency: args.concurrency,
        rate: args.rate,
        scheduled: schedule.map(|s| s.measured()),
        warmup: args.warmup,
    };
    Ok(Report::new(setup, &total, elapsed))
}

/// Opens `connections` separate HTTP/2 connections, failing early if the target does not answer.
async fn connect(text: &str, target: &http::Uri, connections: u32) -> Result<Vec<wire::Connection>, BenchError> {
    let failed = |reason: String| BenchError::Connect {
        target: text.to_string(),
        reason,
    };
    let host = target
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = target.port_u16().unwrap_or(80);
    let mut opened = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let tcp = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect((host, port)))
            .await
            .map_err(|_| failed("no answer within 5s".into()))?
            .map_err(|e| failed(e.to_string()))?;
        tcp.set_nodelay(true).map_err(|e| failed(e.to_string()))?;
        let connection = wire::Connection::open(tcp)
            .await
            .map_err(|e| failed(format!("HTTP/2 handshake: {e}")))?;
        opened.push(connection);
    }
    Ok(opened)
}

/// The progress bar on stderr: time through the run, requests measured so far and their rate.
struct Progress {
    bar: ProgressBar,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(quiet: bool, plan: Arc<Plan>, tallies: Vec<Arc<Mutex<Tally>>>) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress {
                bar: ProgressBar::hidden(),
                ticker: None,
            };
        }
        let total = plan.deadline - plan.start;
        let bar = ProgressBar::new(total.as_millis() as u64);
        if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:30}] {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        let ticking = bar.clone();
        let ticker = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(200));
            loop {
                every.tick().await;
                let now = Instant::now();
                ticking.set_position((now - plan.start).as_millis() as u64);
                if now < plan.measure_from {
                    let left = plan.measure_from - now;
                    ticking.set_message(format!("warming up, {:.1}s left", left.as_secs_f64()));
                    continue;
                }
                let requests: u64 = tallies.iter().map(|t| load::lock(t).requests).sum();
                let seconds = (now - plan.measure_from).as_secs_f64();
                ticking.set_message(format!(
                    "{seconds:.1}s  {requests} requests  {:.0} req/s",
                    requests as f64 / seconds.max(1e-3)
                ));
            }
        });
        Progress {
            bar,
            ticker: Some(ticker),
        }
    }

    fn finish(self) {
        if let Some(ticker) = self.ticker {
            ticker.abort();
        }
        self.bar.finish_and_clear();
    }
}

fn parse_target(text: &str) -> Result<String, String> {
    if text.starts_with("https://") {
        return Err(format!(
            "'{text}': https is not supported, sluice-bench speaks plaintext HTTP/2 (http://HOST:PORT)"
        ));
    }
    if !text.starts_with("http://") {
        return Err(format!("'{text}' is not an http://HOST:PORT address"));
    }
    Endpoint::from_shared(text.to_string())
        .map(|_| text.to_string())
        .map_err(|e| format!("'{text}' is not a URL: {e}"))
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 && rate <= MAX_RATE => Ok(rate),
        _ => Err(format!(
            "'{text}' is not a rate above 0 and at most {MAX_RATE} requests per second"
        )),
    }
}

/// Parses `500ms`, `10s`, `2m` or `1h` (whole numbers; `0` alone is allowed), up to a day.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let Ok(n) = number.parse::<u64>() else {
        return Err(format!(
            "'{text}' is not a duration (expected a whole number and a unit: 500ms, 10s, 2m, 1h)"
        ));
    };
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" if n == 0 => 0,
        "" => return Err(format!("'{text}' has no unit (use ms, s, m or h, e.g. {n}s)")),
        _ => return Err(format!("'{text}': unknown unit '{unit}' (use ms, s, m or h)")),
    };
    match n.checked_mul(unit_ms).map(Duration::from_millis) {
        Some(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(format!("'{text}' is longer than 24h")),
    }
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("'{text}' is zero; it must be longer")),
        d => Ok(d),
    }
}

fn parse_non_empty(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("may not be empty".to_string());
    }
    Ok(text.to_string())
}

fn parse_entry(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("'{text}' is not KEY=VALUE with a non-empty key")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(flags: &[&str]) -> Result<BenchArgs, String> {
        Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
            .map(|cli| cli.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_duration("2m"), Ok(ms(120_000)));
        assert_eq!(parse_duration("1h"), Ok(ms(3_600_000)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10").unwrap_err().contains("has no unit"));
        assert!(parse_duration("10d").unwrap_err().contains("unknown unit 'd'"));
        assert!(parse_duration("1.5s").unwrap_err().contains("unknown unit '.5s'"));
        assert!(parse_duration("s").unwrap_err().contains("is not a duration"));
        assert!(parse_duration("25h").unwrap_err().contains("longer than 24h"));
        assert!(parse_duration("99999999999999999999s").is_err());
        assert!(parse_positive_duration("0s").unwrap_err().contains("is zero"));
    }

    #[test]
    fn defaults() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.target, "http://127.0.0.1:8081");
        assert_eq!(args.api, Api::Envoy);
        assert_eq!((args.connections, args.concurrency, args.threads), (4, 64, 1));
        assert_eq!(args.rate, None);
        assert_eq!(args.duration, Duration::from_secs(10));
        assert_eq!(args.keys, KeySpec::Hot);
        assert_eq!(args.descriptor_key, "user");
    }

    #[test]
    fn every_bad_flag_is_named() {
        let cases: &[(&[&str], &str)] = &[
            (&["--target", "127.0.0.1:8081"], "--target"),
            (&["--target", "https://h:1"], "https is not supported"),
            (&["--api", "redis"], "--api"),
            (&["--connections", "0"], "--connections"),
            (&["--threads", "0"], "--threads"),
            (&["--concurrency", "x"], "--concurrency"),
            (&["--rate", "0"], "--rate"),
            (&["--rate", "inf"], "--rate"),
            (&["--duration", "10"], "--duration"),
            (&["--warmup", "1x"], "--warmup"),
            (&["--domain", ""], "--domain"),
            (&["--keys", "zipf:0"], "--keys"),
            (&["--descriptors", "0"], "--descriptors"),
            (&["--descriptor-key", ""], "--descriptor-key"),
            (&["--parent-entry", "=x"], "--parent-entry"),
            (&["--hits-addend=-1"], "--hits-addend"),
            (&["--timeout", "0s"], "--timeout"),
        ];
        for (flags, want) in cases {
            let e = parse(flags).unwrap_err();
            assert!(e.contains(want), "{flags:?}: {e}");
        }
    }

    #[tokio::test]
    async fn flags_that_do_not_go_together() {
        let args = parse(&["--connections", "8", "--concurrency", "4"]).unwrap();
        let e = run(args).await.unwrap_err();
        assert!(
            matches!(
                e,
                BenchError::Flag {
                    flag: "--concurrency",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("less than --connections 8"), "{e}");
    }

    #[tokio::test]
    async fn unreachable_target_is_named() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let target = format!("http://127.0.0.1:{port}");
        let e = run(parse(&["--target", &target]).unwrap()).await.unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("cannot connect to --target '{target}'")),
            "{e}"
        );
    }
}
