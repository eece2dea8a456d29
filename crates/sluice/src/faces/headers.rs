//! Rate limit response headers that sluice adds itself (off by default; Envoy builds its own `x-ratelimit-*` from the
//! statuses): the legacy `RateLimit-Limit`/`RateLimit-Remaining`/`RateLimit-Reset` set, the IETF draft fields
//! `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), and `Retry-After` on OVER_LIMIT. They
//! describe the most constrained status: when the request is over, the over-limit status that frees up last (its
//! `reset_after_us` is the wait until its hit would pass, so `Retry-After` says when a retry can succeed); otherwise
//! the one with the least left.

use std::borrow::Cow;

use crate::limiter::{Code, Decision, Status};
use crate::rules::ListAction;

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

/// Which rate limit headers to add, and the names of the legacy set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHeaders {
    pub mode: HeaderMode,
    pub names: LegacyNames,
}

/// The names of the legacy set (the reference's `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`,
/// `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyNames {
    pub limit: Cow<'static, str>,
    pub remaining: Cow<'static, str>,
    pub reset: Cow<'static, str>,
}

impl LegacyNames {
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    pub const STANDARD: LegacyNames = LegacyNames {
        limit: Cow::Borrowed("RateLimit-Limit"),
        remaining: Cow::Borrowed("RateLimit-Remaining"),
        reset: Cow::Borrowed("RateLimit-Reset"),
    };
}

impl ResponseHeaders {
    /// No headers.
    pub const OFF: ResponseHeaders = ResponseHeaders::standard(HeaderMode::Off);

    /// `mode` with the standard names.
    pub const fn standard(mode: HeaderMode) -> ResponseHeaders {
        ResponseHeaders {
            mode,
            names: LegacyNames::STANDARD,
        }
    }
}

impl Default for ResponseHeaders {
    fn default() -> Self {
        ResponseHeaders::OFF
    }
}

/// Checks a header name given on the command line: an HTTP token, as Envoy accepts it.
pub fn check_name(name: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !name.is_empty() && name.chars().all(token) {
        Ok(name.to_string())
    } else {
        Err(format!("'{name}' is not an HTTP header name"))
    }
}

/// The headers for a decision, as (name, value) pairs: first, whatever the mode, the lists that decided it
/// (`X-Sluice-List-Deny`, `X-Sluice-List-Allow`: the list's name), then the rate limit headers the mode asks for.
pub fn for_decision<'a>(headers: &'a ResponseHeaders, decision: &Decision) -> Vec<(&'a str, String)> {
    let mode = headers.mode;
    let names = &headers.names;
    let mut headers: Vec<(&str, String)> = decision
        .lists
        .iter()
        .map(|(action, name)| {
            let header = match action {
                ListAction::Deny => "X-Sluice-List-Deny",
                ListAction::Allow => "X-Sluice-List-Allow",
            };
            (header, name.to_string())
        })
        .collect();
    let Some(status) = constraining(decision) else {
        return headers;
    };
    let Some(applied) = &status.limit else {
        return headers;
    };
    let limit = applied.limit.requests;
    let reset = status.reset_after_us.unwrap_or(0).div_ceil(1_000_000);
    if matches!(mode, HeaderMode::Legacy | HeaderMode::Both) {
        headers.push((&*names.limit, limit.to_string()));
        headers.push((&*names.remaining, status.remaining.to_string()));
        headers.push((&*names.reset, reset.to_string()));
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
            lists: Vec::new(),
        }
    }

    #[test]
    fn most_constrained_status_in_both_sets() {
        let d = decision(
            Code::Ok,
            vec![status(Code::Ok, 7, 30, None), status(Code::Ok, 2, 20, Some("lo\"gin"))],
        );
        let both = ResponseHeaders::standard(HeaderMode::Both);
        let h = for_decision(&both, &d);
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
        assert!(for_decision(&ResponseHeaders::OFF, &d).is_empty());
    }

    #[test]
    fn legacy_names_are_configurable() {
        let d = decision(Code::Ok, vec![status(Code::Ok, 3, 9, None)]);
        let mut custom = ResponseHeaders::standard(HeaderMode::Legacy);
        custom.names.remaining = "X-RateLimit-Left".into();
        let h = for_decision(&custom, &d);
        assert!(h.contains(&("X-RateLimit-Left", "3".to_string())), "{h:?}");
        assert!(h.contains(&("RateLimit-Limit", "10".to_string())), "{h:?}");
        assert_eq!(check_name("X-Left"), Ok("X-Left".to_string()));
        assert!(check_name("bad name").is_err() && check_name("").is_err());
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
        let legacy = ResponseHeaders::standard(HeaderMode::Legacy);
        let h = for_decision(&legacy, &d);
        assert!(h.contains(&("Retry-After", "40".to_string())), "{h:?}");
        assert!(h.contains(&("RateLimit-Reset", "40".to_string())), "{h:?}");
        let none = decision(Code::Ok, vec![]);
        assert!(for_decision(&ResponseHeaders::standard(HeaderMode::Both), &none).is_empty());
    }
}
