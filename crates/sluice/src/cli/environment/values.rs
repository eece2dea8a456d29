//! The reference's value syntaxes, parsed as Go parses them (booleans, durations), and the pieces of a Redis URL
//! built from its variables.

use std::time::Duration;

/// Go's `strconv.ParseBool`.
pub(super) fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration`: a sequence of numbers with units (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), e.g.
/// `1m30s`; `0` alone is zero. Negative durations are refused.
pub fn parse_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * nanos;
    }
    (total.is_finite() && total < u64::MAX as f64).then(|| Duration::from_nanos(total as u64))
}

/// `host:port` or `:port` (every interface) as a socket address.
pub(super) fn socket_addr(s: &str) -> Option<String> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_string()
    };
    full.parse::<std::net::SocketAddr>().ok().map(|a| a.to_string())
}

/// `REDIS_AUTH` (`password`, or `user:password`) as the user-info part of a URL.
pub(super) fn userinfo(auth: &str) -> String {
    match auth.split_once(':') {
        Some((user, pass)) => format!("{}:{}@", encode(user), encode(pass)),
        None => format!(":{}@", encode(auth)),
    }
}

/// Percent-encodes everything but the unreserved characters of RFC 3986.
pub(super) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
