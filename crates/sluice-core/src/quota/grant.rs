//! Sizing grants: each due bucket's share of its quota granted ([`Buckets::grant`]) and turned into the
//! assignment that brings its Envoy there, the bucket's other streams told when they must size theirs again.
//!
//! [`Buckets::grant`]: crate::limiter::Buckets::grant

use std::sync::Arc;

use super::Quotas;
use super::demand::DEMAND_WINDOW_US;
use super::holding::Change;
use super::stream::{QuotaStream, Watch};
use super::vocabulary::{Action, BucketId, NO_REFILL_S, Strategy};
use crate::limiter::{Charged, Claim, QuotaState};
use crate::rules::BucketSettings;
use crate::store::{Announcements, Counters, Granted, Grants, MAX_LEDGER_AMOUNT, Notice};

/// One bucket to size a grant for, after its report (or a read) was charged.
pub(super) struct Due {
    pub(super) bucket: BucketId,
    pub(super) charged: Charged,
    /// From a report: its allowed and denied requests.
    pub(super) report: Option<(u64, u64)>,
}

impl<S: Counters + Announcements + Grants> Quotas<S> {
    /// Sizes each due bucket's grant and turns it into assignments: after a report, one for every bucket; on a tick,
    /// only those that changed or are due.
    pub(super) async fn size(
        &self,
        stream: &mut QuotaStream,
        domain: &Arc<str>,
        due: Vec<Due>,
        now: u64,
        reported: bool,
    ) -> Vec<Action> {
        let mut actions = Vec::with_capacity(due.len());
        let mut claimed: Vec<(BucketId, QuotaState, u64, Option<Rate>)> = Vec::new();
        for due in due {
            claimed.extend(self.prepare(stream, due, now, reported, &mut actions));
        }
        if claimed.is_empty() {
            return actions;
        }
        let streams = self.population().max(1);
        let claims: Vec<Claim<'_>> = claimed
            .iter()
            .map(|(bucket, state, want, rate)| {
                let watch = &stream.buckets[bucket];
                let held = match rate {
                    Some(_) => watch.rate_share,
                    None => watch.holding.exposure(),
                };
                Claim {
                    bucket,
                    holder: &stream.holder,
                    held: held.min(MAX_LEDGER_AMOUNT),
                    want: *want,
                    ttl_us: (u64::from(state.settings.assignment_ttl_s) + 1) * 1_000_000,
                    newcomer: (watch.reports < 2).then_some(streams),
                    rate: rate.map(|r| r.limit),
                }
            })
            .collect();
        let granted = self.limiter.buckets().grant(domain, &claims).await;
        let mut announce = Vec::new();
        for ((bucket, state, want, rate), granted) in claimed.into_iter().zip(granted) {
            let granted = match granted {
                Ok(Some(granted)) => granted,
                Ok(None) => continue,
                Err(e) => {
                    // Its Envoy keeps its assignment until the TTL lapses, then follows its expired-assignment
                    // behaviour.
                    tracing::warn!(error = %e, "an RLQS grant could not be sized");
                    continue;
                }
            };
            let Some(watch) = stream.buckets.get_mut(&bucket) else {
                continue;
            };
            let grant = (&state, want, rate, granted);
            actions.extend(self.apply(watch, bucket, grant, (now, reported), &mut announce));
        }
        if !announce.is_empty() {
            for ledger in &announce {
                self.notify(ledger, Some(&stream.inbox));
            }
            self.limiter.store().announce(Notice::Quota(announce)).await;
        }
        actions
    }

    /// Takes a due bucket's charge into its watch. A limited bucket (its ledger now watched) returns its claim on the
    /// quota, with the stream's demand as its want; one with no limit, or one that only counts, passes everything:
    /// an ALLOW_ALL joins `actions` after a report, or on a tick when it changed or is due.
    fn prepare(
        &self,
        stream: &mut QuotaStream,
        Due {
            bucket,
            charged,
            report,
        }: Due,
        now: u64,
        reported: bool,
        actions: &mut Vec<Action>,
    ) -> Option<(BucketId, QuotaState, u64, Option<Rate>)> {
        let watch = stream.buckets.get_mut(&bucket)?;
        watch.settings = settings_of(&charged);
        if let Some((allowed, denied)) = report {
            watch.consume(now, allowed, denied);
        } else {
            watch.lapse(now);
        }
        let ttl = watch.settings.assignment_ttl_s;
        match charged {
            Charged::Limited(state) if !state.shadow => {
                let ledger = state.ledger.as_str().to_string();
                if watch.ledger.as_deref() != Some(ledger.as_str()) {
                    if let Some(old) = watch.ledger.take() {
                        self.unwatch(&old, &stream.inbox);
                    }
                    self.watch(&ledger, &stream.inbox);
                    watch.ledger = Some(ledger);
                }
                let demand = watch.demand.estimate(now);
                let rate = Rate::of(&state);
                let want = match rate {
                    // Its requests per window of the rate, from those of the last DEMAND_WINDOW_US.
                    Some(r) => u64::try_from(
                        (u128::from(demand) * u128::from(r.window_us)).div_ceil(u128::from(DEMAND_WINDOW_US)),
                    )
                    .unwrap_or(u64::MAX),
                    None => demand,
                };
                Some((bucket, state, want.clamp(1, MAX_LEDGER_AMOUNT), rate))
            }
            // No limit, or one that only counts: everything passes.
            _ => {
                let unchanged = watch.sent.is_some_and(|(s, _, _)| s == Strategy::AllowAll);
                if reported || !unchanged || watch.due(now) {
                    let action = self.assign(watch, bucket, Strategy::AllowAll, ttl, false);
                    self.record(watch, &action, now);
                    actions.push(action);
                }
                None
            }
        }
    }

    /// Applies a bucket's grant (its quota's state, the want claimed, what was granted): the assignment to send, if
    /// any (on a tick, only what changed, or a refresh that is due). When the bucket's other streams must size
    /// theirs again, its ledger joins `announce`.
    fn apply(
        &self,
        watch: &mut Watch,
        bucket: BucketId,
        (state, want, rate, granted): (&QuotaState, u64, Option<Rate>, Granted),
        (now, reported): (u64, bool),
        announce: &mut Vec<String>,
    ) -> Option<Action> {
        let (kind, size, due) = (watch.sent.map(|s| s.0), watch.holding.size(), watch.due(now));
        // The first to find the quota spent tells the others, who hold tokens that are no longer there.
        let exhausted = granted.left == 0 && watch.retry_at_us.is_none() && watch.sent.is_some();
        if exhausted {
            self.stats.exhausted.increment(1);
        }
        let tell = exhausted
            || watch.announced_want == 0
            || want >= watch.announced_want.saturating_mul(2)
            || want.saturating_mul(2) <= watch.announced_want
            || granted.entry < watch.entry
            || (reported && granted.held < granted.share);
        watch.entry = granted.entry;
        watch.granted = granted.held;
        let action = match rate {
            Some(rate) => self.deliver_rate(watch, bucket, rate, granted),
            None => self.deliver(watch, bucket, state, granted, now, reported),
        };
        if tell {
            watch.announced_want = want;
            announce.extend(watch.ledger.clone());
        }
        // On a tick, only what changed (a bucket that starts full always does, even at the same size), or a refresh
        // that is due.
        let Action::Assign { strategy, fresh, .. } = &action else {
            return None;
        };
        if reported || due || *fresh || kind != Some(*strategy) || size != watch.holding.size() {
            self.record(watch, &action, now);
            return Some(action);
        }
        None
    }

    /// The assignment that brings the Envoy to `granted.held` tokens, given what it holds ([`Holding::resize`]).
    fn deliver(
        &self,
        watch: &mut Watch,
        bucket: BucketId,
        state: &QuotaState,
        granted: Granted,
        now: u64,
        reported: bool,
    ) -> Action {
        let ttl = watch.settings.assignment_ttl_s;
        // What its demand likely spent since its report, or since its last assignment if that came later.
        let from = watch
            .sent
            .map_or(watch.reported_us, |(_, at, _)| at.max(watch.reported_us));
        let since = now.saturating_sub(from) as f64 / DEMAND_WINDOW_US as f64;
        let likely_spent = (watch.reports >= 2).then(|| watch.demand.estimate(now) as f64 * since);
        let (size, fresh) = match (
            watch.holding.resize(granted.held, reported, likely_spent),
            watch.holding.size(),
        ) {
            (Change::Resize(size), _) | (Change::Keep, Some(size)) => (size, false),
            (Change::Fresh(size), _) => (size, true),
            (Change::Deny, _) | (Change::Keep, None) => {
                // With nothing left, DENY_ALL until a request fits again (sluice sends a new assignment then),
                // within the TTL; with tokens held by others, until they give some back (they tell), or the TTL.
                let retry = (granted.left == 0).then(|| retry_after(state));
                watch.retry_at_us = retry.map(|r| now.saturating_add(r));
                let ttl = match retry {
                    Some(r) => u32::try_from(r.div_ceil(1_000_000)).unwrap_or(u32::MAX).clamp(1, ttl),
                    None => ttl,
                };
                return self.assign(watch, bucket, Strategy::DenyAll, ttl, false);
            }
        };
        let strategy = Strategy::TokenBucket {
            max_tokens: size,
            tokens_per_fill: 1,
            fill_interval_s: NO_REFILL_S,
        };
        self.assign(watch, bucket, strategy, ttl, fresh)
    }

    /// The refilling token bucket of a share of a rate: `granted.held` tokens per window, in a bucket of a quarter
    /// of that (at least 1), so that an Envoy admits its share every window and at most a quarter more in bursts.
    fn deliver_rate(&self, watch: &mut Watch, bucket: BucketId, rate: Rate, granted: Granted) -> Action {
        let ttl = watch.settings.assignment_ttl_s;
        watch.holding.clear();
        watch.rate_share = granted.held;
        let share = u32::try_from(granted.held).unwrap_or(u32::MAX);
        if share == 0 {
            return self.assign(watch, bucket, Strategy::DenyAll, ttl, false);
        }
        let strategy = Strategy::TokenBucket {
            max_tokens: share.div_ceil(RATE_BURST_PARTS),
            tokens_per_fill: share,
            fill_interval_s: rate.fill_interval_s(),
        };
        self.assign(watch, bucket, strategy, ttl, false)
    }

    /// An assignment of `strategy` for `bucket`; see [`Action::Assign`].
    pub(super) fn assign(
        &self,
        watch: &mut Watch,
        bucket: BucketId,
        strategy: Strategy,
        ttl_s: u32,
        fresh: bool,
    ) -> Action {
        if strategy != Strategy::DenyAll {
            watch.retry_at_us = None;
        }
        match strategy {
            // Not counted in a ledger: whatever the Envoy admits is charged when it reports.
            Strategy::AllowAll => watch.holding.clear(),
            Strategy::DenyAll => watch.holding.drop_bucket(),
            Strategy::TokenBucket { .. } => {}
        }
        Action::Assign {
            bucket,
            strategy,
            ttl_s: ttl_s.max(1),
            fresh,
        }
    }

    /// Notes an assignment as sent: its TTL runs from now.
    pub(super) fn record(&self, watch: &mut Watch, action: &Action, now: u64) {
        let Action::Assign { strategy, ttl_s, .. } = action else {
            return;
        };
        watch.sent = Some((*strategy, now, *ttl_s));
        match strategy {
            Strategy::AllowAll => &self.stats.allow_all,
            Strategy::DenyAll => &self.stats.deny_all,
            Strategy::TokenBucket { .. } => &self.stats.token_bucket,
        }
        .increment(1);
    }
}

/// The longest window shared as a rate: a quota whose limits all have windows this short (a few report intervals) is
/// shared as refilling token buckets, one with a longer one as a budget.
pub const RATE_WINDOW_MAX_US: u64 = 60_000_000;

/// A rate's token bucket holds this fraction of its share per window at most: the burst an Envoy may admit on top of
/// its share.
pub const RATE_BURST_PARTS: u32 = 4;

/// The limit a quota shared as a rate is shared by: its most constrained (the fewest requests per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rate {
    pub(super) limit: u64,
    pub(super) window_us: u64,
}

impl Rate {
    /// A quota's rate, when every limit's window is at most [`RATE_WINDOW_MAX_US`].
    fn of(state: &QuotaState) -> Option<Rate> {
        if state.tiers.is_empty()
            || state
                .tiers
                .iter()
                .any(|t| t.window_us == 0 || t.window_us > RATE_WINDOW_MAX_US)
        {
            return None;
        }
        state
            .tiers
            .iter()
            .map(|t| Rate {
                limit: t.limit,
                window_us: t.window_us,
            })
            .min_by(|a, b| {
                (u128::from(a.limit) * u128::from(b.window_us)).cmp(&(u128::from(b.limit) * u128::from(a.window_us)))
            })
    }

    /// The window in whole seconds, as Envoy's `fill_interval` carries it (at least 1).
    fn fill_interval_s(self) -> u32 {
        u32::try_from(self.window_us.div_ceil(1_000_000))
            .unwrap_or(u32::MAX)
            .max(1)
    }
}

/// Whether a quota is shared as a rate (every limit's window at most [`RATE_WINDOW_MAX_US`]), not as a budget.
pub(super) fn is_rate(state: &QuotaState) -> bool {
    Rate::of(state).is_some()
}

/// The settings of the rule a bucket matched (defaults when none did).
pub(super) fn settings_of(charged: &Charged) -> BucketSettings {
    match charged {
        Charged::Limited(state) => state.settings,
        _ => BucketSettings::default(),
    }
}

/// When a request fits the quota again, from now: the latest of its exhausted limits'.
fn retry_after(state: &QuotaState) -> u64 {
    state
        .tiers
        .iter()
        .filter(|t| t.remaining == 0)
        .map(|t| t.retry_after_us)
        .max()
        .unwrap_or(1_000_000)
        .max(1)
}
