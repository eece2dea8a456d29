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
    /// `Some(streams)`: the holder has not said its demand yet (before its second report). It wants as much as any
    /// other wants and may take the reserve; for a budget with no other holder, it gets at most what is left divided
    /// by `streams`, the RLQS streams connected to every instance on the store (at least 1), as each may come for
    /// the bucket at once.
    pub newcomer: Option<u64>,
    /// A rate, not a budget: the holders share this many tokens per window of the quota's most constrained limit, as
    /// refilling token buckets; `held` is the holder's share now, and its entry follows its grant both ways.
    pub rate: Option<u64>,
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

/// The part of what is left that only a newcomer may take, so that one is served at once: one twenty-fifth.
pub const RESERVE_PARTS: u64 = 25;

/// Wants weigh in the surplus at most this much each (exact in the scripts' doubles, summed over any ledger).
const WEIGHT_CAP: u64 = 1 << 32;

/// What each holder is to hold of `pool`: its max-min fair share by want ([`fair_shares`]), and of what those leave
/// over (when every want is met), a part in proportion to its want, rounded down. `lua/ledger.lua`'s `targets` is its
/// twin, computed in the same doubles.
pub fn targets(pool: u64, wants: &[(&str, u64)]) -> Vec<u64> {
    let mut shares = fair_shares(pool, wants);
    let surplus = pool - shares.iter().sum::<u64>();
    let weight: u64 = wants.iter().map(|w| w.1.min(WEIGHT_CAP)).sum();
    if surplus > 0 && weight > 0 {
        for (share, want) in shares.iter_mut().zip(wants) {
            *share += (surplus as f64 * want.1.min(WEIGHT_CAP) as f64 / weight as f64).floor() as u64;
        }
    }
    shares
}

/// One holder's side of a grant ([`allot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant<'a> {
    pub name: &'a str,
    /// What it holds by its entry: for a rate, its share of the rate now.
    pub held: u64,
    pub want: u64,
    /// It has not said its demand yet: it wants as much as any other.
    pub newcomer: bool,
}

/// What [`allot`] decided for a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allotted {
    /// What it may hold from now on.
    pub amount: u64,
    /// What it is to hold ([`targets`]).
    pub share: u64,
    /// Its entry: `amount`, or for a budget what it holds if that is more (tokens handed out are not taken back
    /// before the holder reports them unspent).
    pub entry: u64,
}

/// The rule of [`Grants::grant`](crate::store::Grants::grant), shared by both stores (`lua/ledger.lua`'s `grant` is
/// its twin): what `me` may hold when the others hold and want `others` and the quota has `left` left (for a rate,
/// `left` is the rate's limit per window, and nothing is kept in reserve). `newcomer`: see [`Grant::newcomer`].
pub fn allot(left: u64, me: Claimant<'_>, others: &[Claimant<'_>], newcomer: Option<u64>, rate: bool) -> Allotted {
    let reserve = if rate { 0 } else { left / RESERVE_PARTS };
    let pool = left - reserve;
    // A newcomer's demand is not known yet (its entry says so): it wants as much as any other.
    let top = others.iter().map(|o| o.want).fold(me.want, u64::max);
    let want = if newcomer.is_some() { top } else { me.want };
    let mut wants: Vec<(&str, u64)> = others
        .iter()
        .map(|o| (o.name, if o.newcomer { top } else { o.want }))
        .collect();
    wants.push((me.name, want));
    let shares = targets(pool, &wants);
    let share = shares[others.len()];
    let held = me.held;
    let others_held: u64 = others.iter().map(|o| o.held).sum();
    let free = left.saturating_sub(others_held).saturating_sub(held);
    let open = if newcomer.is_some() {
        free
    } else {
        free.saturating_sub(reserve)
    };
    let lacking: u64 = others.iter().zip(&shares).map(|(o, &s)| s.saturating_sub(o.held)).sum();
    let mut amount = if left == 0 {
        0
    } else if held < share {
        // What is open is shared by all that lack, in proportion to what each lacks (at least a token while any is
        // open): the first to ask does not take what the others wait for.
        let lack = share - held;
        let part = (open as f64 * lack.min(WEIGHT_CAP) as f64 / (lacking + lack).min(WEIGHT_CAP) as f64).floor() as u64;
        held + lack.min(part.max(open.min(1)))
    } else {
        // Down to its share at once: what it holds past that is the others' (its entry keeps it until it reports).
        share
    };
    if let Some(streams) = newcomer.filter(|_| !rate && others.is_empty()) {
        // A lone newcomer's first grants stay within its part of what is left were every connected stream to come
        // for the bucket at once: all of it when it is the only one (with others, its share is the limit).
        amount = amount.min(held.max(left / streams.max(1)));
    }
    let entry = if rate { amount } else { amount.max(held) };
    Allotted { amount, share, entry }
}
