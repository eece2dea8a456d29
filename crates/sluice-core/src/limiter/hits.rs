//! How a descriptor becomes the store's hit: its identity (the keys of its counters, with the pattern in place of
//! the value at a `share_threshold` level) and the limits it counts against.

use super::core::Core;
use super::request::{Descriptor, Request};
use crate::rules::{Rule, Tier, TierCost};
use crate::store::{Announcements, CounterKey, Counters, Hit, Identity, KeyBuilder, Mode, RecordSpec, TierSpec};

impl<S: Counters + Announcements> Core<S> {
    /// The identity of a descriptor of `domain` (its counters' keys): `shared` levels hold their pattern in place of
    /// the value.
    pub(super) fn identity(&self, domain: &str, descriptor: &Descriptor, shared: &[(usize, &str)]) -> Identity {
        identity_of(
            CounterKey::builder(&self.settings.key_prefix, domain).layout(self.settings.key_layout),
            &descriptor.entries,
            shared,
        )
    }

    /// The store's hit for one descriptor and the limits it matched (`tiers`, `rule`, `shared` levels), of `cost`
    /// (and `named` costs for limits that count one).
    pub(super) fn hit(
        &self,
        request: &Request,
        descriptor: &Descriptor,
        (tiers, rule, shared): (&[Tier], Option<&Rule>, &[(usize, &str)]),
        cost: u64,
        named: &[(String, u64)],
    ) -> Hit {
        // A cost past the largest capacity + 1 can never fit, and bounded it stays exact in the scripts' doubles.
        let capacity = tiers.iter().map(|t| u64::from(t.limit.capacity())).max().unwrap_or(0);
        let cost = cost.min(capacity + 1);
        let id = self.identity(&request.domain, descriptor, shared);
        let queue = tiers.iter().any(|t| t.limit.algorithm.queues());
        let regions = self.guard.regions().is_some();
        let record = rule.and_then(|r| r.record.as_ref()).map(|record| RecordSpec {
            key: id.records(),
            size: record.size,
            // The recorded entry may sit in this descriptor or in another one of the same request.
            value: std::iter::once(descriptor)
                .chain(&request.descriptors)
                .flat_map(|d| &d.entries)
                .find(|(k, _)| **k == *record.key)
                .map(|(_, v)| v.clone()),
        });
        Hit {
            tiers: tiers
                .iter()
                .map(|t| TierSpec {
                    key: tier_key(&id, t, alone(tiers, rule)),
                    algorithm: t.limit.algorithm,
                    limit: u64::from(t.limit.requests),
                    window_us: t.limit.window_us(),
                    burst: u64::from(t.limit.burst),
                    cost: match t.cost {
                        TierCost::Request => None,
                        ref other => Some(other.of(cost, named)),
                    },
                    // Without other regions a global limit is an ordinary one (and keeps the compact calls).
                    global: t.global && regions,
                })
                .collect(),
            cost,
            lease: String::new(),
            fields: if queue { descriptor.entries.clone() } else { Vec::new() },
            record,
            mode: Mode::Hit,
        }
    }
}

/// The identity of `entries` after `key`'s start: each entry's value, or the `share_threshold` pattern at the levels
/// in `shared`.
pub(super) fn identity_of(mut key: KeyBuilder, entries: &[(String, String)], shared: &[(usize, &str)]) -> Identity {
    for (depth, (k, v)) in entries.iter().enumerate() {
        let value = shared
            .iter()
            .find(|(d, _)| *d == depth)
            .map_or(v.as_str(), |(_, pattern)| pattern);
        key = key.entry(k, value);
    }
    key.finish()
}

/// Whether a descriptor's limits are one limit and nothing else it writes (no hit records): what the reference's
/// layout may name by the reference's key, which has no hash tag, so nothing else of the descriptor need share its
/// cluster slot.
pub(super) fn alone(tiers: &[Tier], rule: Option<&Rule>) -> bool {
    tiers.len() == 1 && rule.is_none_or(|r| r.record.is_none())
}

/// The counter key of one limit of a descriptor.
pub(super) fn tier_key(id: &Identity, tier: &Tier, lone: bool) -> CounterKey {
    // A descriptor's one fixed window, counting requests in this region alone, is what the reference can express: in
    // its layout, under its key.
    let reference = lone && tier.limit.algorithm.is_reference() && tier.cost == TierCost::Request;
    if let Some(key) = id
        .reference_window(tier.limit.window_us())
        .filter(|_| reference && !tier.global)
    {
        return key;
    }
    let key = match tier.cost.label() {
        None => id.tier(tier.limit.algorithm, tier.limit.counter_span_us()),
        Some(label) => id.tier_costing(tier.limit.algorithm, tier.limit.window_us(), &label),
    };
    // A descriptor's one fixed window, counted in this region alone, is a plain counter: the fewest commands a hit.
    if lone && tier.limit.algorithm == crate::rules::Algorithm::FixedWindow && !tier.global {
        return key.plain();
    }
    key
}
