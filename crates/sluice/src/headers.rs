//! Rate limit response headers that sluice adds itself (off by default; Envoy builds its own `x-ratelimit-*` from the
//! statuses): the legacy `RateLimit-Limit`/`RateLimit-Remaining`/`RateLimit-Reset` set, the IETF draft fields
//! `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), and `Retry-After` on OVER_LIMIT. They
//! describe the most constrained status: when the request is over, the over-limit status that frees up last (its
//! `reset_after_us` is the wait until its hit would pass, so `Retry-After` says when a retry can succeed); otherwise
//! the one with the least left.

use crate::limiter::{Code, Decision, Status};

/// Which headers to add to `response_headers_to_add`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HeaderMode {
    /// None (Envoy's own `x-ratelimit-*` headers remain available).
    #[default]
    Off,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Legacy,
    /// `RateLimit-Policy` and `RateLimit`, the current IETF draft.
    Draft,
    /// Both sets.
    Both,
}

/// The headers for a decision, as (name, value) pairs.
pub fn for_decision(mode: HeaderMode, decision: &Decision) -> Vec<(&'static str, String)> {
    let mut headers = Vec::new();
    let Some(status) = constraining(decision) else {
        return headers;
    };
    let Some(applied) = &status.limit else {
        return headers;
    };
    let limit = applied.limit.requests;
    let reset = status.reset_after_us.unwrap_or(0).div_ceil(1_000_000);
    if matches!(mode, HeaderMode::Legacy | HeaderMode::Both) {
        headers.push(("RateLimit-Limit", limit.to_string()));
        headers.push(("RateLimit-Remaining", status.remaining.to_string()));
        headers.push(("RateLimit-Reset", reset.to_string()));
    }
    if matches!(mode, HeaderMode::Draft | HeaderMode::Both) {
        let name = sf_string(applied.name.as_deref().unwrap_or("default"));
        let window = applied.limit.window_us() / 1_000_000;
        headers.push(("RateLimit-Policy", format!("{name};q={limit};w={window}")));
        headers.push(("RateLimit", format!("{name};r={};t={reset}", status.remaining)));
    }
    if mode != HeaderMode::Off && decision.overall == Code::OverLimit {
        headers.push(("Retry-After", reset.max(1).to_string()));
    }
    headers
}

/// The status the headers describe.
fn constraining(decision: &Decision) -> Option<&Status> {
    let limited = decision.statuses.iter().filter(|s| s.limit.is_some());
    if decision.overall == Code::OverLimit {
        limited
            .filter(|s| s.code == Code::OverLimit)
            .max_by_key(|s| s.reset_after_us)
    } else {
        limited.min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset_after_us)))
    }
}

/// A structured-field string: quoted, with `"` and `\` escaped and anything outside printable ASCII dropped.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars().filter(|c| (' '..='~').contains(c)) {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::limiter::AppliedLimit;
    use crate::rules::{Limit, Unit};

    fn status(code: Code, remaining: u32, reset_s: u64, name: Option<&str>) -> Status {
        Status {
            code,
            limit: Some(AppliedLimit {
                limit: Limit::fixed(10, Unit::Minute),
                name: name.map(Arc::from),
            }),
            remaining,
            reset_after_us: Some(reset_s * 1_000_000),
        }
    }

    fn decision(overall: Code, statuses: Vec<Status>) -> Decision {
        Decision {
            overall,
            statuses,
            metadata: Vec::new(),
            lease: None,
            queued: Vec::new(),
        }
    }

    #[test]
    fn most_constrained_status_in_both_sets() {
        let d = decision(
            Code::Ok,
            vec![status(Code::Ok, 7, 30, None), status(Code::Ok, 2, 20, Some("lo\"gin"))],
        );
        let h = for_decision(HeaderMode::Both, &d);
        assert_eq!(
            h,
            [
                ("RateLimit-Limit", "10".to_string()),
                ("RateLimit-Remaining", "2".to_string()),
                ("RateLimit-Reset", "20".to_string()),
                ("RateLimit-Policy", r#""lo\"gin";q=10;w=60"#.to_string()),
                ("RateLimit", r#""lo\"gin";r=2;t=20"#.to_string()),
            ]
        );
        assert!(for_decision(HeaderMode::Off, &d).is_empty());
    }

    #[test]
    fn over_limit_adds_retry_after_from_the_status_that_frees_last() {
        let d = decision(
            Code::OverLimit,
            vec![
                status(Code::OverLimit, 0, 5, None),
                status(Code::OverLimit, 0, 40, None),
            ],
        );
        let h = for_decision(HeaderMode::Legacy, &d);
        assert!(h.contains(&("Retry-After", "40".to_string())), "{h:?}");
        assert!(h.contains(&("RateLimit-Reset", "40".to_string())), "{h:?}");
        let none = decision(Code::Ok, vec![]);
        assert!(for_decision(HeaderMode::Both, &none).is_empty());
    }
}
