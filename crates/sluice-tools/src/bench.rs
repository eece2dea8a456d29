//! `sluice-bench`: a load generator that speaks sluice's two gRPC APIs over real connections and reports
//! throughput, answers and latency percentiles.
//!
//! h2load (see TOOLS.md) sends one fixed body and never reads `grpc-status`, so it can neither spread load over
//! many counters nor tell a right answer from a wrong one. This generator draws descriptor values from a key
//! distribution, checks every answer (a known code, one status per descriptor sent), counts failures by gRPC code,
//! and at a fixed rate measures latency from each request's scheduled send time, so that a stalled server cannot
//! hide behind the requests it delayed (coordinated omission).
//!
//! - `args`: the flags, and the parsing of their values.
//! - [`keys`]: key distributions and the small random number generator behind them.
//! - `load`: connections, request slots, the answer checks and the tallies.
//! - `pace`: the thread that releases the requests of a fixed rate at their scheduled times.
//! - `report`: percentiles, the human table and the JSON object.
//! - `wire`: unary gRPC calls straight over HTTP/2 streams, a far cheaper client than tonic's.

mod args;
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

use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
pub use args::{Api, BenchArgs, parse_duration};
pub use keys::KeySpec;
use keys::Keys;
pub use load::CheckFailure;
use load::{Client, Plan, Shape, Tally};
use pace::{Pacer, Schedule};
pub use report::{Percentiles, Report};

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
    let target = check_flags(&args)?;
    let channels = connect(&args.target, &target, args.connections).await?;
    let schedule = args.rate.map(|rate| Schedule::new(rate, args.warmup, args.duration));
    let shape = Arc::new(request_shape(&args));
    let tallies: Vec<Arc<Mutex<Tally>>> = channels.iter().map(|_| Arc::new(Mutex::new(Tally::new()))).collect();

    let plan = start_plan(&args, schedule)?;
    let progress = Progress::start(args.quiet, plan.clone(), tallies.clone());
    let slots = spawn_slots(&args, &target, &channels, &shape, &tallies, &plan)?;
    let stopped = join_slots(slots).await;
    let elapsed = plan.measure_from.elapsed();
    progress.finish();
    stopped?;

    let mut total = Tally::new();
    for tally in &tallies {
        total.merge(&load::lock(tally));
    }
    Ok(Report::new(setup(args, schedule), &total, elapsed))
}

/// Rejects flags that are valid alone but not together, before anything connects, and parses `--target` into the URI
/// the connections and the request paths are built from.
fn check_flags(args: &BenchArgs) -> Result<http::Uri, BenchError> {
    if args.concurrency < args.connections {
        return Err(BenchError::Flag {
            flag: "--concurrency",
            message: format!(
                "{} is less than --connections {}: every connection needs at least one request in flight",
                args.concurrency, args.connections
            ),
        });
    }
    args.target.parse().map_err(|e| BenchError::Flag {
        flag: "--target",
        message: format!("'{}' is not a URL: {e}", args.target),
    })
}

/// What every request looks like, shared by all slots: the domain, the fixed parent entries, and the key
/// distribution the varying descriptor values are drawn from.
fn request_shape(args: &BenchArgs) -> Shape {
    Shape {
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
    }
}

/// Starts the clock: the run's phases from now on, and for a fixed rate the pacer thread that releases each request
/// at its scheduled time. Done after connecting, so the handshakes do not eat into the warm-up.
fn start_plan(args: &BenchArgs, schedule: Option<Schedule>) -> Result<Arc<Plan>, BenchError> {
    let start = Instant::now();
    let pacer = schedule
        .map(|s| Pacer::start(s, start, u64::from(args.concurrency)))
        .transpose()
        .map_err(BenchError::Runtime)?;
    Ok(Arc::new(Plan {
        start,
        measure_from: start + args.warmup,
        deadline: start + args.warmup + args.duration,
        pacer,
        timeout: args.timeout,
    }))
}

/// Spawns the `--concurrency` request slots, spread round-robin over the connections; each slot counts into its
/// connection's tally, so slots on different connections never contend for one lock.
fn spawn_slots(
    args: &BenchArgs,
    target: &http::Uri,
    channels: &[wire::Connection],
    shape: &Arc<Shape>,
    tallies: &[Arc<Mutex<Tally>>],
    plan: &Arc<Plan>,
) -> Result<JoinSet<()>, BenchError> {
    let mut slots = JoinSet::new();
    for slot in 0..args.concurrency as usize {
        let connection = slot % channels.len();
        slots.spawn(load::drive(
            slot as u64,
            Client::new(args.api, channels[connection].clone(), target).map_err(|e| BenchError::Flag {
                flag: "--target",
                message: format!("'{}' cannot address a method: {e}", args.target),
            })?,
            shape.clone(),
            tallies[connection].clone(),
            plan.clone(),
        ));
    }
    Ok(slots)
}

/// Waits for every slot to reach the deadline. A slot that panicked is a bug in the generator: its reason (the first
/// one, if several) fails the run rather than leaving a report with a hole in it.
async fn join_slots(mut slots: JoinSet<()>) -> Result<(), BenchError> {
    let mut stopped = None;
    while let Some(joined) = slots.join_next().await {
        if let Err(e) = joined {
            stopped.get_or_insert(e.to_string());
        }
    }
    stopped.map_or(Ok(()), |reason| Err(BenchError::Slot(reason)))
}

/// The run's settings as the report repeats them, so that a result can be read without the command that made it.
fn setup(args: BenchArgs, schedule: Option<Schedule>) -> report::Setup {
    report::Setup {
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
    }
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

#[cfg(test)]
mod tests {
    use super::args::parse;
    use super::*;

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
