//! The memory store's decision loop, the twin of `lua/decide.lua` and `lua/ledger.lua`: one descriptor decided against all
//! its tiers under its shard's lock, atomically (each tier by its algorithm's check and commit, in
//! `store/algorithm/`), the hit records, the reservations and their settlement, and the RLQS grants.

use super::shard::{Ledger, Records, Reservation, Shard, State};
use super::{MemoryStore, lock};
use crate::store::algorithm::{self, Check, Expiry, Refund, ceil_ms_us};
use crate::store::{
    Claimant, Grant, Granted, Hit, Outcome, RESERVATION_GRACE_US, Settled, Settlement, TierSettled, TierSpec,
    all_count, allot, tier_costs,
};

/// What a tier's hit of `cost` would find in the shard at `now`, by its algorithm's check.
fn check(shard: &Shard, t: &TierSpec, now: u64, cost: u64, force: bool) -> Check {
    algorithm::check(t, shard.counter(t.key.as_str(), now), now, cost, force)
}

/// What a settlement's refund of `amount`, charged at `at`, would write to a counting tier.
fn refund(shard: &Shard, t: &TierSpec, now: u64, at: u64, amount: u64) -> Option<Refund> {
    algorithm::refund(t, shard.counter(t.key.as_str(), now), now, at, amount)
}

impl MemoryStore {
    pub(super) fn decide(&self, now: u64, hit: &Hit) -> Outcome {
        let peek = hit.peeks();
        let tag = hit.tiers.first().map(|t| t.key.tag()).unwrap_or_default();
        let mut shard = self.shard(tag, now);
        shard.decisions += 1;
        // Each tier's own cost, bounded by its capacity + 1 (`TierSpec::bounded_cost`); the hit is written at all only
        // if one of them is positive.
        let cost = |t: &TierSpec| t.bounded_cost(hit.cost);
        let positive = hit.tiers.iter().any(|t| cost(t) > 0);
        // A forced hit is counted by every tier, fitting or not; what it leaves is reported, even where it did not fit.
        let force = hit.forces();
        let checks: Vec<Check> = hit
            .tiers
            .iter()
            .map(|t| self.check_tier(&shard, t, now, cost(t), force))
            .collect();
        let admitted = checks.iter().all(|c| c.ok);
        // A lone fixed window counts its denials, as the reference does, except a cost that can never fit.
        // Not when reserving: a refused reservation holds nothing. Nor a global one (`prelude.lua`'s `global_of`).
        let single_fixed = match hit.tiers.as_slice() {
            [t] => t.algorithm.counts_denials_alone() && !t.global && cost(t) <= t.limit && hit.reservation().is_none(),
            _ => false,
        };
        let commit = !peek && positive && (admitted || single_fixed || force);
        // The reservation record, written as `lua/decide.lua` writes it: for a hit admitted and committed, or forced.
        if let Some(r) = hit.reserves().filter(|_| commit && (admitted || force)) {
            let expires_at = now + ceil_ms_us(r.bounded_ttl_us());
            let expiry = Expiry::Always(expires_at + RESERVATION_GRACE_US);
            let estimates = hit.tier_costs();
            shard.upsert(r.key.as_str(), now, expiry, |state: &mut Reservation| {
                *state = Reservation {
                    estimates,
                    at: now,
                    expires_at,
                }
            });
        }
        let mut longest = 0;
        let mut tiers = Vec::with_capacity(checks.len());
        for (spec, check) in hit.tiers.iter().zip(checks) {
            // A tier whose cost is 0 is checked, never written (it takes no lease, appends no entry).
            let cost = cost(spec);
            let written = commit && cost > 0;
            let id = written
                .then(|| algorithm::commit(&mut *shard, spec, &check, now, cost, &hit.lease))
                .flatten();
            let tier = algorithm::tier_outcome(spec, &check, cost, (written, peek, force), id);
            // The hit records live as long as the longest-lived tier the hit was counted in.
            if written {
                longest = longest.max(tier.reset_after_us);
            }
            tiers.push(tier);
        }
        let mut records = Vec::new();
        if let Some(record) = &hit.record {
            let key = record.key.as_str();
            if let (true, Some(value)) = (commit, &record.value) {
                let expiry = Expiry::Always(now + ceil_ms_us(longest.max(1)));
                shard.upsert(key, now, expiry, |Records(list): &mut Records| {
                    list.push_front(value.clone());
                    list.truncate(record.size as usize);
                });
            } else if peek {
                if let Some(State::Records(Records(list))) = shard.live(key, now) {
                    records = list.iter().take(record.size as usize).cloned().collect();
                }
            }
        }
        Outcome {
            admitted,
            tiers,
            records,
        }
    }

    /// A tier's check; a global one's against its limit less what the other regions counted, reporting the sum, as
    /// the global forms of `algorithm/*.lua` decide it (`lua/prelude.lua`'s `global_of`).
    fn check_tier(&self, shard: &Shard, t: &TierSpec, now: u64, cost: u64, force: bool) -> Check {
        if !t.global {
            return check(shard, t, now, cost, force);
        }
        let window = t.window_us.max(1);
        let start = now - now % window;
        let regions = lock(&self.regions);
        let count = |s: u64| {
            regions
                .get(t.key.regions(s).as_str())
                .filter(|(expires, _)| *expires > now)
                .map_or(0, |(_, counts)| counts.values().sum::<u64>())
        };
        let others = t
            .algorithm
            .others_weigh(count(start.saturating_sub(window)), count(start), now - start, window);
        drop(regions);
        algorithm::global_check((t.limit, t.window_us), now, cost, others, |limit| {
            let reduced = TierSpec { limit, ..t.clone() };
            check(shard, &reduced, now, cost, force)
        })
    }

    /// Settles one reservation under its descriptor's shard lock, as `settle` in `lua/decide.lua` does.
    pub(super) fn settle_one(&self, now: u64, settlement: &Settlement) -> Settled {
        let tiers = &settlement.tiers;
        if !all_count(tiers) {
            return Settled::Unknown;
        }
        let key = settlement.reservation.as_str();
        // The shard `decide` wrote the record in: its tiers' (the record shares their hash tag).
        let tag = tiers.first().map(|t| t.key.tag()).unwrap_or_default();
        let mut shard = self.shard(tag, now);
        let (estimates, at) = match shard.live(key, now) {
            // One estimate per tier, or the settlement names other tiers than the reservation: left as it is. A
            // settlement finds only a live reservation, a reaping only an expired one.
            Some(State::Reservation(r))
                if r.estimates.len() == tiers.len() && (r.expires_at <= now) == settlement.reap =>
            {
                (r.estimates.clone(), r.at)
            }
            _ => return Settled::Unknown,
        };
        // Reaped: settled at the estimates, which changes no tier.
        let actuals = if settlement.reap {
            estimates.clone()
        } else {
            tier_costs(tiers, settlement.cost)
        };
        let mut settled: Vec<TierSettled> = estimates
            .iter()
            .zip(actuals)
            .map(|(&estimate, actual)| TierSettled::new(estimate, actual))
            .collect();
        // Every tier is read before any is written, as the script does (there a key of the wrong type stops the
        // settlement before it changes anything): a tier charged more is counted as a forced hit of the difference,
        // a tier charged less gives the difference back.
        let checks: Vec<Option<Check>> = tiers
            .iter()
            .zip(&settled)
            .map(|(t, s)| (s.charged > 0).then(|| check(&shard, t, now, s.charged, true)))
            .collect();
        let refunds: Vec<Option<Refund>> = tiers
            .iter()
            .zip(&settled)
            .map(|(t, s)| {
                (s.refunded > 0)
                    .then(|| refund(&shard, t, now, at, s.refunded))
                    .flatten()
            })
            .collect();
        // What is reported as refunded is what came back to a window still in force.
        for (s, refund) in settled.iter_mut().zip(&refunds) {
            s.refunded = refund.as_ref().map_or(0, |r| r.given);
        }
        shard.entries.remove(key);
        for (((spec, s), check), refund) in tiers.iter().zip(&settled).zip(&checks).zip(refunds) {
            if let Some(check) = check {
                algorithm::commit(&mut *shard, spec, check, now, s.charged, "");
            }
            if let Some(refund) = refund {
                shard.give_back(spec.key.as_str(), now, refund);
            }
        }
        // Each tier as a peek of cost 1 reports it.
        let checks: Vec<Check> = tiers.iter().map(|t| check(&shard, t, now, 1, false)).collect();
        let outcome = Outcome {
            admitted: checks.iter().all(|c| c.ok),
            tiers: checks.iter().map(|c| c.outcome(false, true, false, None)).collect(),
            records: Vec::new(),
        };
        Settled::Done {
            tiers: settled,
            outcome,
        }
    }

    /// One grant under its bucket's shard lock, as `grant` in `lua/ledger.lua` does: what is left is read and the
    /// ledger updated in one step.
    pub(super) fn grant_one(&self, now: u64, grant: &Grant) -> Granted {
        let mut shard = self.shard(grant.ledger.tag(), now);
        let left = grant
            .tiers
            .iter()
            .map(|t| check(&shard, t, now, 0, false).rem0)
            .min()
            .unwrap_or(0);
        let key = grant.ledger.as_str();
        let mut entries = match shard.live(key, now) {
            Some(State::Ledger(Ledger(entries))) => entries.clone(),
            _ => Default::default(),
        };
        entries.retain(|_, e| e.2 > now);
        let previous = entries.remove(&grant.holder).map_or(0, |e| e.0);
        // A holder holds at most what its entry says it was granted.
        let (held, want) = (grant.held.min(previous), grant.want);
        let mut granted = Granted {
            left,
            holders: entries.len() as u64,
            total_held: entries.values().map(|e| e.0).sum(),
            ..Granted::default()
        };
        if want > 0 {
            let left = grant.rate.unwrap_or(left);
            let others: Vec<Claimant<'_>> = entries
                .iter()
                .map(|(name, e)| Claimant {
                    name,
                    held: e.0,
                    want: e.1,
                    newcomer: e.3,
                })
                .collect();
            let me = Claimant {
                name: &grant.holder,
                held,
                want,
                newcomer: grant.newcomer.is_some(),
            };
            let allotted = allot(left, me, &others, grant.newcomer, grant.rate.is_some());
            granted = Granted {
                held: allotted.amount,
                share: allotted.share,
                left,
                entry: allotted.entry,
                holders: granted.holders + 1,
                total_held: granted.total_held + allotted.entry,
            };
            entries.insert(
                grant.holder.clone(),
                (allotted.entry, want, now + grant.ttl_us, grant.newcomer.is_some()),
            );
        }
        let until = entries.values().map(|e| e.2).max().unwrap_or(now);
        shard.upsert(key, now, Expiry::Always(until), |Ledger(ledger): &mut Ledger| {
            *ledger = entries;
        });
        granted
    }
}
