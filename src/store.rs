//! Where counters live: one trait, [`Store`], with an in-memory implementation ([`memory`], the default) and a
//! Redis one ([`redis`], Lua scripts run by EVALSHA). Both pass one contract suite (`tests/contract.rs`), so their
//! answers never drift apart.
//!
//! A store receives every counter of one request at once and applies them together: the Redis store sends them in
//! one pipeline, one network round trip. Keys are built here, by [`CounterKey`], in one documented encoding.

pub mod memory;
pub mod redis;

use std::fmt::Write as _;
use std::future::Future;

/// One counter touched by a request: a hit of `cost` against a fixed window of `window_us` that admits `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub key: CounterKey,
    pub limit: u64,
    pub window_us: u64,
    /// 0 checks without consuming.
    pub cost: u64,
}

/// The state of one counter after a hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    /// The count after the hit (or the current count for a cost of 0).
    pub used: u64,
    pub remaining: u64,
    /// Time until the window ends, in microseconds.
    pub reset_after_us: u64,
}

/// The state of one counter, read without changing it, with when a hit of `cost` would be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    pub used: u64,
    pub remaining: u64,
    pub reset_after_us: u64,
    /// `Some(0)` if the cost is allowed now, `None` if it never will be (it exceeds the limit).
    pub retry_after_us: Option<u64>,
}

/// Why a store could not answer. Every kind maps to gRPC UNAVAILABLE.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("store connection failed: {0}")]
    Connection(String),
    #[error("store script failed: {0}")]
    Script(String),
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// The `kind` label of the store error metric.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Connection(_) => "connection",
            StoreError::Script(_) => "script",
            StoreError::Other(_) => "other",
        }
    }
}

/// Counter storage. `now_us` is the request's time in microseconds since the Unix epoch, read once per request.
pub trait Store: Send + Sync + 'static {
    /// A short name for metrics and logs: `memory` or `redis`.
    fn name(&self) -> &'static str;

    /// Applies every hit of one request and returns one outcome per hit, in order.
    fn hit(
        &self,
        now_us: u64,
        hits: &[Hit],
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send;

    /// Reads the counters of `hits` (their `cost` is the hypothetical cost) without creating, changing or extending
    /// anything.
    fn peek(
        &self,
        now_us: u64,
        hits: &[Hit],
    ) -> impl Future<Output = Result<Vec<Remaining>, StoreError>> + Send;

    /// Whether the store answers (for `/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Fixed-window arithmetic shared by both stores, so they compute the same answers from the same count.
pub mod fixed_window {
    use super::{Outcome, Remaining};

    /// The start of the epoch-aligned window holding `now_us`.
    pub fn window_start(now_us: u64, window_us: u64) -> u64 {
        now_us - now_us % window_us
    }

    /// Time from `now_us` to the end of its window.
    pub fn reset_after(now_us: u64, window_us: u64) -> u64 {
        window_us - now_us % window_us
    }

    /// The outcome of a hit whose count is now `used`: over the limit iff `used > limit`.
    pub fn outcome(used: u64, limit: u64, reset_after_us: u64) -> Outcome {
        Outcome {
            allowed: used <= limit,
            used,
            remaining: limit.saturating_sub(used),
            reset_after_us,
        }
    }

    /// What a read of the current count `used` reports for a hypothetical `cost`.
    pub fn remaining(used: u64, limit: u64, cost: u64, reset_after_us: u64) -> Remaining {
        let retry_after_us = if cost > limit {
            None
        } else if used.saturating_add(cost) <= limit {
            Some(0)
        } else {
            Some(reset_after_us)
        };
        Remaining {
            used,
            remaining: limit.saturating_sub(used),
            reset_after_us,
            retry_after_us,
        }
    }
}

/// The name of one counter in a store.
///
/// Encoding: `<prefix>{<tag>}<body>`, where `<body>` is `<domain>` then, per descriptor entry, `|<key>=<value>`,
/// every piece written as `<byte length>:<bytes>` (so `a_b`+`c` and `a`+`b_c` can never collide, whatever bytes the
/// request carries), then `|<algorithm>/<window seconds>/<window start seconds>`. `<tag>` is 16 hex digits of a
/// 64-bit FNV-1a hash of `<body>` without the window part: a Redis hash tag that keeps every key of one identity on
/// one cluster slot, and that raw request text never reaches. The prefix may not contain `{` or `}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey(String);

impl CounterKey {
    /// Starts a key for `domain` with the configured prefix.
    pub fn builder(prefix: &str, domain: &str) -> KeyBuilder {
        let mut body = String::with_capacity(64);
        piece(&mut body, domain);
        KeyBuilder {
            prefix_len: prefix.len(),
            out: {
                let mut s = String::with_capacity(prefix.len() + 18 + body.len() + 64);
                s.push_str(prefix);
                s
            },
            body,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Appends entries to a [`CounterKey`].
#[derive(Debug)]
pub struct KeyBuilder {
    prefix_len: usize,
    out: String,
    body: String,
}

impl KeyBuilder {
    pub fn entry(mut self, key: &str, value: &str) -> KeyBuilder {
        self.body.push('|');
        piece(&mut self.body, key);
        self.body.push('=');
        piece(&mut self.body, value);
        self
    }

    /// Finishes the key with the algorithm's name and the window holding `now_us`.
    pub fn window(mut self, algorithm: &str, window_us: u64, now_us: u64) -> CounterKey {
        debug_assert_eq!(self.out.len(), self.prefix_len);
        let tag = fnv1a(self.body.as_bytes());
        let _ = write!(
            self.out,
            "{{{tag:016x}}}{}|{algorithm}/{}/{}",
            self.body,
            window_us / 1_000_000,
            fixed_window::window_start(now_us, window_us) / 1_000_000
        );
        CounterKey(self.out)
    }
}

fn piece(out: &mut String, s: &str) {
    let _ = write!(out, "{}:", s.len());
    out.push_str(s);
}

/// 64-bit FNV-1a: stable across processes and versions, which a hash tag must be.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Checks a key prefix: it may not contain hash-tag braces.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!(
            "key prefix '{prefix}' may not contain '{{' or '}}'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entries: &[(&str, &str)]) -> String {
        let mut b = CounterKey::builder("p:", "d");
        for (k, v) in entries {
            b = b.entry(k, v);
        }
        b.window("fixed_window", 60_000_000, 125_000_000).0
    }

    #[test]
    fn encoding_is_unambiguous() {
        assert_ne!(key(&[("a_b", "c")]), key(&[("a", "b_c")]));
        assert_ne!(key(&[("a", "b|c=d")]), key(&[("a", "b"), ("c", "d")]));
        assert_ne!(key(&[("a", "")]), key(&[("a", "}")]));
    }

    #[test]
    fn layout_and_hash_tag() {
        let k = key(&[("user", "{x}")]);
        assert!(k.starts_with("p:{"), "{k}");
        let tag_end = k.find('}').unwrap();
        assert_eq!(tag_end, 3 + 16, "{k}");
        assert!(k[3..tag_end].chars().all(|c| c.is_ascii_hexdigit()));
        assert!(k.ends_with("1:d|4:user=3:{x}|fixed_window/60/120"), "{k}");
    }

    #[test]
    fn windows_differ_only_after_the_tag() {
        let a = CounterKey::builder("", "d").entry("k", "v").window(
            "fixed_window",
            1_000_000,
            5_000_000,
        );
        let b = CounterKey::builder("", "d").entry("k", "v").window(
            "fixed_window",
            1_000_000,
            6_000_000,
        );
        assert_ne!(a, b);
        assert_eq!(a.0[..18], b.0[..18]);
    }

    #[test]
    fn fixed_window_math() {
        assert_eq!(fixed_window::window_start(125, 60), 120);
        assert_eq!(fixed_window::reset_after(125, 60), 55);
        assert!(fixed_window::outcome(3, 3, 1).allowed);
        assert!(!fixed_window::outcome(4, 3, 1).allowed);
        assert_eq!(fixed_window::remaining(2, 3, 2, 9).retry_after_us, Some(9));
        assert_eq!(fixed_window::remaining(1, 3, 2, 9).retry_after_us, Some(0));
        assert_eq!(fixed_window::remaining(0, 3, 4, 9).retry_after_us, None);
        assert!(check_prefix("a{").is_err());
    }
}
