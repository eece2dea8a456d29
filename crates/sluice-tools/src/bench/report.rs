//! The outcome of a run: every request counted once (OK, OVER_LIMIT, a failed check or a gRPC error), the
//! throughput, and latency percentiles, printed as a table for people or as JSON for scripts.

use std::fmt::{self, Write as _};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::args::Api;
use super::keys::KeySpec;
use super::load::Tally;

/// What a run measured, after the warm-up.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// What was run.
    pub setup: Setup,
    /// From the end of the warm-up to the last answer.
    pub elapsed: Duration,
    /// Every measured request, whatever became of it: `ok + over_limit + failed_checks + errors`.
    pub requests: u64,
    pub ok: u64,
    pub over_limit: u64,
    /// Calls that succeeded with a wrong answer (see [`super::load::CheckFailure`]).
    pub failed_checks: u64,
    pub first_failure: Option<String>,
    /// Failed calls by gRPC code, most frequent first; timeouts count as `DEADLINE_EXCEEDED`.
    pub errors: Vec<(tonic::Code, u64)>,
    /// From the scheduled send time at a fixed rate, from the actual send time in a closed loop.
    pub latency: Percentiles,
    /// At a fixed rate only: from the actual send time, which hides queueing behind slow answers.
    pub service_time: Option<Percentiles>,
}

/// Latency percentiles, read from an HDR histogram with three significant digits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Percentiles {
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
    pub mean: Duration,
}

impl Percentiles {
    /// Reads a histogram of microseconds.
    fn of(histogram: &Histogram<u64>) -> Percentiles {
        let at = |q| Duration::from_micros(histogram.value_at_quantile(q));
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: Duration::from_micros(histogram.max()),
            mean: Duration::from_secs_f64(histogram.mean() / 1e6),
        }
    }

    fn all(&self) -> [(&'static str, Duration); 6] {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p99", self.p99),
            ("p99.9", self.p999),
            ("max", self.max),
            ("mean", self.mean),
        ]
    }
}

/// The run's description, as the report repeats it.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub target: String,
    pub api: Api,
    pub domain: String,
    pub keys: KeySpec,
    pub descriptors: u32,
    pub descriptor_key: String,
    pub connections: u32,
    pub concurrency: u32,
    /// The fixed rate in requests per second; `None` for a closed loop.
    pub rate: Option<f64>,
    /// At a fixed rate, how many requests were due in the measured window (`requests` falls short of it when the
    /// server could not keep up at this concurrency).
    pub scheduled: Option<u64>,
    pub warmup: Duration,
}

impl Report {
    pub(super) fn new(setup: Setup, tally: &Tally, elapsed: Duration) -> Report {
        let mut errors: Vec<(tonic::Code, u64)> = tally
            .errors
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(code, n)| (tonic::Code::from_i32(code as i32), *n))
            .collect();
        errors.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        let service_time = setup.rate.map(|_| Percentiles::of(&tally.service_time));
        Report {
            setup,
            elapsed,
            requests: tally.requests,
            ok: tally.ok,
            over_limit: tally.over_limit,
            failed_checks: tally.failed_checks,
            first_failure: tally.first_failure.as_ref().map(ToString::to_string),
            errors,
            latency: Percentiles::of(&tally.latency),
            service_time,
        }
    }

    /// Measured requests per second.
    pub fn throughput(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            self.requests as f64 / seconds
        } else {
            0.0
        }
    }

    /// Failed calls, all codes together.
    pub fn error_count(&self) -> u64 {
        self.errors.iter().map(|(_, n)| n).sum()
    }

    /// Every request got a well-formed answer.
    pub fn passed(&self) -> bool {
        self.failed_checks == 0 && self.error_count() == 0
    }

    /// The report as one JSON object (durations in microseconds).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(1024);
        let optional = |v: Option<String>| v.unwrap_or_else(|| "null".to_string());
        let _ = write!(
            out,
            "{{\"target\":{},\"api\":\"{}\",\"rpc\":\"{}\",\"domain\":{},\"keys\":\"{}\",\"descriptors\":{},\
             \"descriptor_key\":{},\"connections\":{},\"concurrency\":{},\"rate\":{},\"scheduled\":{},\
             \"warmup_s\":{:.3},\"elapsed_s\":{:.3},\"requests\":{},\"throughput_rps\":{:.1},\"ok\":{},\
             \"over_limit\":{},\"failed_checks\":{},\"first_failure\":{},\"errors\":{{",
            json_string(&self.setup.target),
            self.setup.api.name(),
            self.setup.api.rpc(),
            json_string(&self.setup.domain),
            self.setup.keys,
            self.setup.descriptors,
            json_string(&self.setup.descriptor_key),
            self.setup.connections,
            self.setup.concurrency,
            optional(self.setup.rate.map(|r| format!("{r}"))),
            optional(self.setup.scheduled.map(|s| s.to_string())),
            self.setup.warmup.as_secs_f64(),
            self.elapsed.as_secs_f64(),
            self.requests,
            self.throughput(),
            self.ok,
            self.over_limit,
            self.failed_checks,
            optional(self.first_failure.as_deref().map(json_string)),
        );
        for (i, (code, n)) in self.errors.iter().enumerate() {
            let comma = if i == 0 { "" } else { "," };
            let _ = write!(out, "{comma}\"{}\":{n}", code_name(*code));
        }
        let _ = write!(
            out,
            "}},\"latency_us\":{},\"service_time_us\":{},\"passed\":{}}}",
            percentiles_json(&self.latency),
            optional(self.service_time.as_ref().map(percentiles_json)),
            self.passed()
        );
        out
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "target         {} {}", self.setup.target, self.setup.api.rpc())?;
        let entry = format!("{}=<{}>", self.setup.descriptor_key, self.setup.keys);
        writeln!(
            f,
            "requests       domain {}, {} descriptor(s) of {entry}",
            self.setup.domain, self.setup.descriptors
        )?;
        match self.setup.rate {
            None => writeln!(
                f,
                "load           closed loop (max throughput), {} connection(s), {} in flight",
                self.setup.connections, self.setup.concurrency
            )?,
            Some(rate) => writeln!(
                f,
                "load           fixed rate {rate} req/s (open loop), {} connection(s), up to {} in flight",
                self.setup.connections, self.setup.concurrency
            )?,
        }
        writeln!(
            f,
            "measured       {} after {} warm-up",
            human(self.elapsed),
            human(self.setup.warmup)
        )?;
        writeln!(
            f,
            "throughput     {} requests, {:.0} req/s",
            self.requests,
            self.throughput()
        )?;
        if let Some(scheduled) = self.setup.scheduled {
            let missing = scheduled.saturating_sub(self.requests);
            write!(f, "schedule       {} of {scheduled} sent", self.requests)?;
            if missing > 0 {
                write!(f, " ({missing} never sent: the server fell behind)")?;
            }
            writeln!(f)?;
        }
        writeln!(f, "answers        OK {}, OVER_LIMIT {}", self.ok, self.over_limit)?;
        write!(f, "failed checks  {}", self.failed_checks)?;
        if let Some(first) = &self.first_failure {
            write!(f, " (first: {first})")?;
        }
        writeln!(f)?;
        write!(f, "errors         {}", self.error_count())?;
        for (i, (code, n)) in self.errors.iter().enumerate() {
            let open = if i == 0 { " (" } else { ", " };
            write!(f, "{open}{} {n}", code_name(*code))?;
        }
        if !self.errors.is_empty() {
            write!(f, ")")?;
        }
        writeln!(f)?;
        writeln!(f)?;
        write!(f, "latency       ")?;
        for (name, _) in self.latency.all() {
            write!(f, "{name:>10}")?;
        }
        writeln!(f)?;
        let rows = match &self.service_time {
            None => vec![("from send", &self.latency)],
            Some(service) => vec![("from schedule", &self.latency), ("from send", service)],
        };
        for (label, percentiles) in rows {
            write!(f, "{label:<14}")?;
            for (_, value) in percentiles.all() {
                write!(f, "{:>10}", human(value))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// A duration in the unit that keeps three or four significant digits.
fn human(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_string()
    } else if d < Duration::from_millis(1) {
        format!("{}µs", d.as_micros())
    } else if d < Duration::from_secs(1) {
        format!("{:.2}ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2}s", d.as_secs_f64())
    }
}

fn percentiles_json(p: &Percentiles) -> String {
    let mut out = String::from("{");
    for (i, (name, value)) in p.all().iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let name = name.replace('.', "");
        let _ = write!(out, "{comma}\"{name}\":{}", value.as_micros());
    }
    out.push('}');
    out
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The canonical gRPC name of a code, as in the gRPC status code table.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::load::Tally;

    fn report(rate: Option<f64>) -> Report {
        let mut tally = Tally::new();
        tally.ok = 7;
        tally.over_limit = 2;
        tally.requests = 10;
        tally.errors[tonic::Code::Unavailable as usize] = 1;
        for us in [100, 200, 300] {
            tally.latency.saturating_record(us);
            tally.service_time.saturating_record(us / 2);
        }
        Report::new(
            Setup {
                target: "http://h:1".into(),
                api: Api::Envoy,
                domain: "ed\"ge".into(),
                keys: KeySpec::Hot,
                descriptors: 1,
                descriptor_key: "user".into(),
                connections: 1,
                concurrency: 2,
                rate,
                scheduled: rate.map(|_| 12),
                warmup: Duration::ZERO,
            },
            &tally,
            Duration::from_secs(2),
        )
    }

    #[test]
    fn counts_throughput_and_verdict() {
        let r = report(None);
        assert_eq!(r.throughput(), 5.0);
        assert_eq!(r.error_count(), 1);
        assert_eq!(r.errors, vec![(tonic::Code::Unavailable, 1)]);
        assert!(!r.passed());
        assert_eq!(r.latency.max, Duration::from_micros(300));
        assert!(r.service_time.is_none());
        assert!(report(Some(5.0)).service_time.is_some());
    }

    #[test]
    fn table_names_what_matters() {
        let text = report(Some(5.0)).to_string();
        for want in [
            "fixed rate 5 req/s",
            "10 of 12 sent (2 never sent",
            "OK 7, OVER_LIMIT 2",
            "errors         1 (UNAVAILABLE 1)",
            "from schedule",
            "300µs",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
    }

    #[test]
    fn json_is_well_formed() {
        let json = report(None).to_json();
        assert!(json.starts_with("{\"target\":\"http://h:1\""), "{json}");
        assert!(json.contains("\"domain\":\"ed\\\"ge\""), "{json}");
        assert!(json.contains("\"rate\":null"), "{json}");
        assert!(json.contains("\"errors\":{\"UNAVAILABLE\":1}"), "{json}");
        assert!(json.contains("\"p999\":300,\"max\":300"), "{json}");
        assert!(json.ends_with("\"service_time_us\":null,\"passed\":false}"), "{json}");
        assert_eq!(json.matches('{').count(), json.matches('}').count());
        assert_eq!(json_string("a\u{1}\n"), "\"a\\u0001\\n\"");
    }
}
