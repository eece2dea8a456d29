//! The RLQS grant ledger's values and rule: one holder's claim ([`Grant`]), what it was granted ([`Granted`]), and the
//! max-min fair shares both stores grant by ([`fair_shares`], [`granted_amount`]; `lua/ledger.lua` is their twin).

use super::{CounterKey, TierSpec};

/// One holder's claim on an RLQS bucket's quota, in the bucket's grant ledger ([`Grants::grant`](crate::store::Grants::grant)). A holder is one
/// Envoy's stream; the ledger records, per holder, the tokens it was granted and has not yet reported used, and how
/// many it wants, so that every instance on one store shares out the same quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The quota's limits (their `cost` is not read): what the quota has left is the least any of them has left now,
    /// as a peek of cost 0 reports it.
    pub tiers: Vec<TierSpec>,
    /// The ledger, with the tiers' hash tag ([`Identity::grants`](super::Identity::grants)).
    pub ledger: CounterKey,
    pub holder: String,
    /// What the holder holds now by its own account: what it was granted less what it reported used (0 once it is
    /// known to have spent everything). At most [`MAX_LEDGER_AMOUNT`].
    pub held: u64,
    /// How many tokens it wants (its recent demand), at most [`MAX_LEDGER_AMOUNT`]; 0: it leaves the ledger.
    pub want: u64,
    /// How long its entry lasts without another grant (an entry whose time has come counts for nothing and is
    /// removed).
    pub ttl_us: u64,
}

/// The most a ledger records of one holder's tokens or wants: exact in the scripts' doubles.
pub const MAX_LEDGER_AMOUNT: u64 = 1 << 52;

/// What [`Grants::grant`](crate::store::Grants::grant) decided for a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Granted {
    /// What the holder may hold from now on: see [`Grants::grant`](crate::store::Grants::grant). Its entry is the larger of this and what it held.
    pub held: u64,
    /// Its max-min fair share of what is left.
    pub share: u64,
    /// What the quota has left (the least of its limits).
    pub left: u64,
    /// The holder's entry now: the larger of `held` and what it holds (at most its entry before).
    pub entry: u64,
    /// The live holders, this one included (0 holders besides when it left).
    pub holders: u64,
    /// What every live holder holds, this one's new amount included: never more than `left` when a grant began
    /// within it.
    pub total_held: u64,
}

/// Max-min fair shares of `capacity` among holders that want `wants` (name, want), in the order given: holders are
/// served from the least wanting up (ties by name), each getting what it wants or an equal part, rounded down, of
/// what the ones before left, whichever is less. What rounding leaves over stays unassigned: the shares never add
/// up to more than `capacity`. Doorman's FAIR_SHARE, in whole tokens; `lua/ledger.lua`'s `fair_shares` is its twin.
pub fn fair_shares(capacity: u64, wants: &[(&str, u64)]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by(|&a, &b| (wants[a].1, wants[a].0).cmp(&(wants[b].1, wants[b].0)));
    let mut shares = vec![0; wants.len()];
    let mut left = capacity;
    for (served, &i) in order.iter().enumerate() {
        let equal = left / (wants.len() - served) as u64;
        let share = wants[i].1.min(equal);
        shares[i] = share;
        left -= share;
    }
    shares
}

/// What a holder holding `held` gets, wanting its `share`, when the others hold `others` (each `(held, share)`) of a
/// quota with `left` left: the rule of [`Grants::grant`](crate::store::Grants::grant), shared by both stores (`lua/ledger.lua`'s `grant` is its
/// twin).
pub fn granted_amount(left: u64, held: u64, share: u64, others: &[(u64, u64)]) -> u64 {
    if left == 0 {
        return 0;
    }
    let others_held: u64 = others.iter().map(|o| o.0).sum();
    let free = left.saturating_sub(others_held).saturating_sub(held);
    if held < share {
        held + (share - held).min(free)
    } else {
        // Give back what the others lack of their shares and cannot take from what is free, and what the holders hold
        // past what is left (usage admitted outside any grant), never going below the share.
        let lacking: u64 = others.iter().map(|&(h, s)| s.saturating_sub(h)).sum();
        let over = (others_held + held).saturating_sub(left);
        let back = lacking.saturating_sub(free).saturating_add(over);
        share.max(held - back.min(held))
    }
}
