//! Top offenders: per rule, the descriptor values hit most and denied most over the last minute and the last hour,
//! across every instance on one store.
//!
//! On the decision path a decided descriptor is noted in a bounded table of this instance (a Space-Saving sketch
//! per rule and kind: at most [`LimiterSettings::top_offenders`](super::LimiterSettings) values, a new value taking
//! the place of the least counted one with its count plus one, so a count is never under its true value and over it
//! by at most the count it replaced). Once a second the tables are added into the store's buckets of ten seconds
//! and of a minute ([`Store::tally`]: in Redis one sorted set per bucket, trimmed to the same bound, gone after an
//! hour), with an index of the rules noted; [`Limiter::top_offenders`] sums the buckets of a span.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Limiter;
use super::decision::LimitError;
use crate::store::{CounterKey, Span, Store, Tally};

/// What was noted since the last flush: per (domain, rule), the values hit and denied.
#[derive(Default)]
pub(crate) struct Offenders {
    noted: Mutex<HashMap<RuleName, RuleTally>>,
}

/// A rule by its domain and path.
type RuleName = (Arc<str>, Arc<str>);

#[derive(Default)]
struct RuleTally {
    hits: SpaceSaving,
    denied: SpaceSaving,
}

/// The Space-Saving sketch: at most `kept` values with their counts.
#[derive(Default)]
struct SpaceSaving(HashMap<Box<str>, u64>);

impl SpaceSaving {
    fn note(&mut self, value: &str, kept: usize) {
        if let Some(n) = self.0.get_mut(value) {
            *n += 1;
            return;
        }
        let mut floor = 0;
        if self.0.len() >= kept {
            let Some((least, &n)) = self.0.iter().min_by_key(|(_, n)| **n) else {
                return;
            };
            let least = least.clone();
            self.0.remove(&least);
            floor = n;
        }
        self.0.insert(value.into(), floor + 1);
    }

    fn take(&mut self) -> Vec<(String, u64)> {
        self.0.drain().map(|(v, n)| (v.into_string(), n)).collect()
    }
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

/// The kind of the set that indexes a domain's rules (its values are rule paths).
const RULES: &str = "rules";

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
        let mut value = String::with_capacity(entries.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 {
                value.push_str(", ");
            }
            value.push_str(k);
            value.push('=');
            value.push_str(v);
        }
        let mut noted = self.noted.lock().unwrap_or_else(|p| p.into_inner());
        let tally = noted.entry((domain.clone(), rule.clone())).or_default();
        tally.hits.note(&value, kept);
        if denied {
            tally.denied.note(&value, kept);
        }
    }

    /// What was noted since the last call, as tallies of the store's sets.
    fn take(&self, prefix: &str) -> Vec<Tally> {
        let noted = std::mem::take(&mut *self.noted.lock().unwrap_or_else(|p| p.into_inner()));
        let mut tallies = Vec::with_capacity(noted.len() * 2);
        let mut rules: HashMap<Arc<str>, Vec<(String, u64)>> = HashMap::new();
        for ((domain, rule), mut tally) in noted {
            let hits = tally.hits.take();
            rules
                .entry(domain.clone())
                .or_default()
                .push((rule.to_string(), hits.iter().map(|(_, n)| n).sum()));
            tallies.push(Tally {
                set: CounterKey::top(prefix, &domain, &rule, "hits"),
                counts: hits,
            });
            let denied = tally.denied.take();
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

impl<S: Store> Limiter<S> {
    /// Adds what was noted to the store once a second, for as long as the limiter lives. Run it once per limiter,
    /// in a task of its own; with `top_offenders` at 0 it returns at once.
    pub async fn keep_offenders(self: Arc<Self>) {
        let kept = self.settings.top_offenders;
        if kept == 0 {
            return;
        }
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.flush_offenders().await;
        }
    }

    /// Adds what was noted since the last flush to the store now (what a failed flush held is dropped and logged).
    pub async fn flush_offenders(&self) {
        let tallies = self.offenders.take(&self.settings.key_prefix);
        if tallies.is_empty() {
            return;
        }
        let kept = self.settings.top_offenders;
        if let Err(e) = self.store().tally(self.clock.now_us(), &tallies, kept).await {
            tracing::warn!(error = %e, tallies = tallies.len(), "top offenders of the last second not stored");
        }
    }

    /// The rules of `domain` noted over `span` (the busiest first, at most `limit`), each with its `limit` values
    /// hit most and denied most, summed across every instance sharing the store.
    pub async fn top_offenders(
        &self,
        domain: &str,
        span: Span,
        limit: usize,
    ) -> Result<Vec<RuleOffenders>, LimitError> {
        if self.rules().domain(domain).is_none() {
            return Err(LimitError::NotFound(format!(
                "domain: no domain '{domain}' is configured"
            )));
        }
        let prefix = &self.settings.key_prefix;
        let now_us = self.clock.now_us();
        let store = self.store();
        let mut rules = store
            .top(now_us, &CounterKey::top(prefix, domain, "", RULES), span)
            .await?;
        rules.truncate(limit);
        let reads = rules.into_iter().map(|(rule, _)| async move {
            let (hits, denied) = (
                CounterKey::top(prefix, domain, &rule, "hits"),
                CounterKey::top(prefix, domain, &rule, "denied"),
            );
            let (mut hits, mut denied) =
                futures::future::try_join(store.top(now_us, &hits, span), store.top(now_us, &denied, span)).await?;
            hits.truncate(limit);
            denied.truncate(limit);
            Ok::<_, LimitError>(RuleOffenders { rule, hits, denied })
        });
        futures::future::try_join_all(reads).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_saving_keeps_the_heavy_values_and_never_undercounts() {
        let mut s = SpaceSaving::default();
        // 3 heavy values among 1 000 distinct light ones, 4 slots.
        for i in 0..1_000 {
            for heavy in ["a", "b", "c"] {
                s.note(heavy, 4);
            }
            s.note(&format!("light{i}"), 4);
        }
        let mut top = s.take();
        top.sort_by_key(|x| std::cmp::Reverse(x.1));
        let heavy: Vec<&str> = top.iter().take(3).map(|(v, _)| v.as_str()).collect();
        assert!(
            heavy.contains(&"a") && heavy.contains(&"b") && heavy.contains(&"c"),
            "{top:?}"
        );
        assert!(top.iter().take(3).all(|(_, n)| *n >= 1_000), "{top:?}");
        assert_eq!(top.len(), 4);
    }
}
