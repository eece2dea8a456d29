//! The flags of `sluice-bench`, and the parsing of their values: every bad value is refused naming the flag.

use std::time::Duration;

use tonic::transport::Endpoint;

use super::keys::KeySpec;

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
    /// `zipf:N[:S]` (0 most often, with exponent S, default 1).
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

/// `flags` parsed as the binary parses them, for tests.
#[cfg(test)]
pub(super) fn parse(flags: &[&str]) -> Result<BenchArgs, String> {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }
    Cli::try_parse_from(std::iter::once("sluice-bench").chain(flags.iter().copied()))
        .map(|cli| cli.args)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
