//! Top offenders: per rule, the descriptor values hit most and denied most over the last minute and the last hour,
//! across every instance on one store.
//!
//! On the decision path a decided descriptor is noted in a bounded table of this instance, per rule and kind
//! ([`TopCounts`], a Space-Saving table trimmed in batches: at most twice
//! [`LimiterSettings::top_offenders`](super::LimiterSettings) values, a count never under its true value). Every
//! [`FLUSH_EVERY`] the tables are added into the store's buckets of ten seconds and of a minute ([`Offenders::tally`](crate::store::Offenders::tally): in Redis one sorted set per bucket, trimmed to the same bound, gone after an
//! hour), with an index of the rules noted; [`Tallies::top_offenders`](super::Tallies::top_offenders) sums the buckets of a span.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{CounterKey, Tally};

/// What was noted since the last flush: per (domain, rule), the values hit and denied.
#[derive(Default)]
pub(crate) struct Offenders {
    noted: Mutex<HashMap<usize, RuleTally>>,
}

/// One rule's tables, found by the address of its path (no string hashed to find them), with its domain and path.
struct RuleTally {
    domain: Arc<str>,
    rule: Arc<str>,
    hits: TopCounts,
    denied: TopCounts,
}

/// A bounded table of counts that never undercounts: up to twice `kept` values; when full, only the `kept` largest
/// stay, and a value that comes (back) in then starts from the largest count let go (`floor`) plus one. So a count is
/// at least the value's true count, and over it by at most `floor`, which stays at most the total counted divided by
/// `kept`. Trimming costs a pass over the table once per `kept` new values: constant work per value.
#[derive(Default)]
struct TopCounts {
    counts: HashMap<Box<str>, u64>,
    floor: u64,
}

impl TopCounts {
    fn note(&mut self, value: &str, kept: usize) {
        if let Some(n) = self.counts.get_mut(value) {
            *n += 1;
            return;
        }
        if self.counts.len() >= 2 * kept {
            self.trim(kept);
        }
        self.counts.insert(value.into(), self.floor + 1);
    }

    /// Keeps the `kept` largest counts, raising the floor to the largest one let go.
    fn trim(&mut self, kept: usize) {
        if self.counts.len() <= kept {
            return;
        }
        let mut all: Vec<(Box<str>, u64)> = self.counts.drain().collect();
        all.select_nth_unstable_by(kept, |a, b| b.1.cmp(&a.1));
        for (_, n) in all.drain(kept..) {
            self.floor = self.floor.max(n);
        }
        self.counts.extend(all);
    }

    /// The `kept` largest counts, and a fresh table.
    fn take(&mut self, kept: usize) -> Vec<(String, u64)> {
        self.trim(kept);
        self.floor = 0;
        self.counts.drain().map(|(v, n)| (v.into_string(), n)).collect()
    }
}

thread_local! {
    /// The text of the descriptor being noted.
    static VALUE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// One rule's top values over a span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleOffenders {
    /// The rule's path (`key=value/key`…).
    pub rule: String,
    /// Decisions per descriptor value, largest first.
    pub hits: Vec<(String, u64)>,
    /// Denials per descriptor value, largest first.
    pub denied: Vec<(String, u64)>,
}

/// How often an instance adds what it noted to the store: the top offenders lag by at most this (and a flush's
/// worst case costs Redis about 0.3 ms per busy rule, BENCHMARKS.md).
pub const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// The kind of the set that indexes a domain's rules (its values are rule paths).
pub(super) const RULES: &str = "rules";

impl Offenders {
    /// Notes one decided descriptor of the rule `rule` in `domain`.
    pub(crate) fn note(
        &self,
        kept: usize,
        domain: &Arc<str>,
        rule: &Arc<str>,
        entries: &[(String, String)],
        denied: bool,
    ) {
        // The `key=value, key=value` text is built in a buffer of the thread's: a value already in the tables costs
        // no allocation (a new one is copied in when it is inserted).
        VALUE.with_borrow_mut(|value| {
            value.clear();
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    value.push_str(", ");
                }
                value.push_str(k);
                value.push('=');
                value.push_str(v);
            }
            let mut noted = self.noted.lock().unwrap_or_else(|p| p.into_inner());
            let tally = noted
                .entry(Arc::as_ptr(rule) as *const u8 as usize)
                .or_insert_with(|| RuleTally {
                    domain: domain.clone(),
                    rule: rule.clone(),
                    hits: TopCounts::default(),
                    denied: TopCounts::default(),
                });
            tally.hits.note(value, kept);
            if denied {
                tally.denied.note(value, kept);
            }
        });
    }

    /// What was noted since the last call, as tallies of the store's sets.
    pub(super) fn take(&self, prefix: &str, kept: usize) -> Vec<Tally> {
        let noted = std::mem::take(&mut *self.noted.lock().unwrap_or_else(|p| p.into_inner()));
        let mut tallies = Vec::with_capacity(noted.len() * 2);
        let mut rules: HashMap<Arc<str>, Vec<(String, u64)>> = HashMap::new();
        for (_, mut tally) in noted {
            let (domain, rule) = (tally.domain.clone(), tally.rule.clone());
            let hits = tally.hits.take(kept);
            rules
                .entry(domain.clone())
                .or_default()
                .push((rule.to_string(), hits.iter().map(|(_, n)| n).sum()));
            tallies.push(Tally {
                set: CounterKey::top(prefix, &domain, &rule, "hits"),
                counts: hits,
            });
            let denied = tally.denied.take(kept);
            if !denied.is_empty() {
                tallies.push(Tally {
                    set: CounterKey::top(prefix, &domain, &rule, "denied"),
                    counts: denied,
                });
            }
        }
        for (domain, counts) in rules {
            tallies.push(Tally {
                set: CounterKey::top(prefix, &domain, "", RULES),
                counts,
            });
        }
        tallies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_keeps_the_heavy_values_and_never_undercounts() {
        let mut s = TopCounts::default();
        // 3 heavy values among 1 000 distinct light ones, 4 slots.
        for i in 0..1_000 {
            for heavy in ["a", "b", "c"] {
                s.note(heavy, 4);
            }
            s.note(&format!("light{i}"), 4);
        }
        let mut top = s.take(4);
        top.sort_by_key(|x| std::cmp::Reverse(x.1));
        let heavy: Vec<&str> = top.iter().take(3).map(|(v, _)| v.as_str()).collect();
        assert!(
            heavy.contains(&"a") && heavy.contains(&"b") && heavy.contains(&"c"),
            "{top:?}"
        );
        assert!(top.iter().take(3).all(|(_, n)| *n >= 1_000), "{top:?}");
        assert_eq!(top.len(), 4);
        // The floor bounds every count's excess: at most the total counted over the values kept.
        assert!(top.iter().all(|(v, n)| v.len() == 1 || *n <= 4_000 / 4), "{top:?}");
    }
}
