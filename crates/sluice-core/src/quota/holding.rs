//! What sluice knows of the tokens one Envoy holds for one bucket, from the assignments it sent and the usage the
//! Envoy reported, without ever seeing the Envoy's token bucket.
//!
//! Envoy 1.40 (`createTokenBucketFromAction` in `global_client_impl.cc`) keeps a token bucket whose settings did not
//! change, starts one that replaces another with different settings at the old one's fill fraction (its tokens scaled
//! by `new size / old size`), and starts one that replaces a DENY_ALL, or nothing, full. Between two reports the Envoy
//! spends tokens sluice does not know of yet, so sluice keeps bounds that hold whatever it spent, and when:
//!
//! - `exposure`: what the Envoy may still admit plus what it admitted and has not reported: the amount its entry in
//!   the bucket's ledger must carry, so that the entries of all Envoys never add up to more than the quota has left;
//! - `remaining`: what its token bucket holds at most;
//! - `weight`: how much each token spent since the last report still lowers `remaining` at least: tokens spent before
//!   a resize to `k` times the size lower it by `k`;
//! - `spare`: how many of the tokens spent since the last report may have come from buckets the Envoy no longer has
//!   (replaced by one that starts full, or by a DENY_ALL): those do not lower `remaining` at all (a bucket that held
//!   `r` at most gives `r / weight` tokens at most);
//! - `after_denial`: what the bucket holds at most if the Envoy denied a request (it had less than a token then) at
//!   any moment since the last report: the changes sent since, applied to one token. A report with denials takes the
//!   bounds down to it, which undoes what the other bounds overcount when a change and spending interleave.
//!
//! A grant above the exposure grows the bucket by the difference (scaled when there is something to scale, else a new
//! bucket of the difference, after a DENY_ALL in the same message); a grant below it shrinks the bucket to the grant,
//! but the exposure stays until the next report says what was spent: tokens already admitted cannot be taken back.

/// Token buckets at most this fraction of a token apart count as equal (floating-point slack).
const SLACK: f64 = 1e-6;

/// How an assignment changes an Envoy's token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Keep the bucket as it is.
    Keep,
    /// Send a bucket of this size: the Envoy carries its fill fraction over.
    Resize(u32),
    /// Send a DENY_ALL and then a bucket of this size, which starts full.
    Fresh(u32),
    /// Send a DENY_ALL: the Envoy has no tokens left to use.
    Deny,
}

/// One Envoy's tokens for one bucket, as far as sluice can know them. The bounds are fractional, as Envoy's tokens
/// are: a bucket resized by a fraction holds a fraction of a token, which a later resize can make whole.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Holding {
    exposure: f64,
    remaining: f64,
    weight: f64,
    spare: f64,
    /// `None`: nothing changed since the last report.
    after_denial: Option<f64>,
    /// The size of the token bucket the Envoy has from sluice, if any.
    size: Option<u32>,
    /// The last report had denials and no bucket started full since: the Envoy's bucket ran dry (less than a token,
    /// and it does not refill), so scaling it would add next to nothing.
    dry: bool,
}

impl Holding {
    /// What the Envoy may still admit plus what it admitted and has not reported, in whole requests.
    pub(crate) fn exposure(&self) -> u64 {
        whole(self.exposure)
    }

    /// The size of the token bucket the Envoy has, if any.
    pub(crate) fn size(&self) -> Option<u32> {
        self.size
    }

    /// A report: the Envoy admitted `allowed` and denied `denied` since its previous one. Its bucket holds what the
    /// bounds leave, and nothing is unreported any more.
    pub(crate) fn report(&mut self, allowed: u64, denied: u64) {
        let spent = allowed as f64;
        let counted = (spent - self.spare).max(0.0);
        let mut remaining = (self.remaining - counted * self.weight).min(self.exposure - spent);
        if denied > 0 {
            remaining = remaining.min(self.after_denial.unwrap_or(0.0));
        }
        self.dry = denied > 0;
        self.remaining = remaining.max(0.0);
        self.exposure = self.remaining;
        self.weight = 1.0;
        self.spare = 0.0;
        self.after_denial = None;
    }

    /// The Envoy's assignment lapsed, or it was sent a DENY_ALL or an ALLOW_ALL: it has no token bucket; what it
    /// admitted and has not reported stays exposed until it reports.
    pub(crate) fn drop_bucket(&mut self) {
        self.discard();
        self.remaining = 0.0;
        self.size = None;
        self.after_denial = Some(1.0);
    }

    /// Forgets everything: the Envoy left the bucket, or it is not counted in a ledger.
    pub(crate) fn clear(&mut self) {
        *self = Holding::default();
    }

    /// Sizes the Envoy's bucket for a grant of `granted` tokens (its ledger entry is then the larger of the grant and
    /// its exposure): the change to send. `reported`: in the answer to a report, when what the bucket holds is known
    /// (only the requests in flight meanwhile are not); else `likely_spent`: what its demand likely spent since, when
    /// its demand is known.
    pub(crate) fn resize(&mut self, granted: u64, reported: bool, likely_spent: Option<f64>) -> Change {
        let target = granted as f64;
        let now = self.exposure();
        // Between reports a resize leaves unknown whether the tokens spent meanwhile came before or after it, and the
        // bounds count the worse: a bucket within a tenth of its grant (and a token) is left as it is.
        let band = if reported { 0.0 } else { target / 10.0 + 1.0 };
        if granted == 0 {
            self.drop_bucket();
            Change::Deny
        } else if granted > now {
            let more = target - self.exposure;
            if more < band {
                return Change::Keep;
            }
            // Scaled while the Envoy holds a token (a new bucket would drop it, and leave unknown which of the two
            // its next report's requests came from), else a new bucket of what is added. Between reports what it
            // holds is not known: scaled while what it likely holds (its bound, less what its demand likely spent),
            // scaled, gives it at least what is added, as scaling a bucket it has spent adds nothing; with its demand
            // unknown, while it may hold at least what is added.
            let worth = match (reported, likely_spent) {
                (true, _) => self.remaining >= 1.0,
                (false, Some(spent)) => {
                    let likely = self.remaining - spent;
                    likely >= 1.0 && likely * (self.remaining + more) >= more * self.remaining
                }
                (false, None) => self.remaining >= more.max(1.0),
            };
            // A bucket run dry is replaced by a fresh one: scaled, the fraction of a token it holds would stay one.
            if let Some(size) = self.size.filter(|_| worth && !self.dry) {
                // Rounded down to a whole size: the Envoy gains `more` at most.
                let scaled = (f64::from(size) * (self.remaining + more) / self.remaining).floor();
                if scaled > f64::from(size) && scaled <= f64::from(u32::MAX) {
                    return self.scale(size, scaled as u32);
                }
            }
            let fresh = more.floor().min(f64::from(u32::MAX));
            if fresh < 1.0 {
                return Change::Keep;
            }
            self.discard();
            self.remaining = fresh;
            self.after_denial = Some(fresh.max(1.0));
            self.exposure += fresh;
            self.size = Some(fresh as u32);
            self.dry = false;
            Change::Fresh(fresh as u32)
        } else if granted < now {
            match self.size {
                Some(size) if self.remaining > target + band + SLACK => {
                    let scaled = (f64::from(size) * target / self.remaining).floor();
                    if scaled < 1.0 {
                        self.drop_bucket();
                        return Change::Deny;
                    }
                    self.scale(size, scaled as u32)
                }
                _ => Change::Keep,
            }
        } else {
            Change::Keep
        }
    }

    /// The Envoy's bucket is replaced: what it spent of it no longer lowers what it holds, and what it spends from now
    /// on lowers it in full. It spent at most what the bucket held, each token lowering it by `weight` at least.
    fn discard(&mut self) {
        if self.remaining > 0.0 {
            self.spare += self.remaining / self.weight;
        }
        self.weight = 1.0;
    }

    /// Resizes the bucket from `from` to `to`, which scales what it holds alike. Growing adds what the bucket may gain
    /// to the exposure; shrinking takes nothing from it: the Envoy may have admitted everything already.
    fn scale(&mut self, from: u32, to: u32) -> Change {
        let k = f64::from(to) / f64::from(from);
        self.exposure += self.remaining * (k - 1.0).max(0.0);
        self.remaining *= k;
        self.weight = (self.weight * k).min(1.0);
        self.after_denial = Some((self.after_denial.unwrap_or(1.0) * k).max(1.0));
        self.size = Some(to);
        Change::Resize(to)
    }
}

/// A fractional bound in whole requests: a request needs a whole token.
fn whole(x: f64) -> u64 {
    (x + SLACK).floor().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy 1.40's side: the tokens of its bucket as it applies changes and spends.
    #[derive(Default)]
    struct Envoy {
        size: Option<u32>,
        tokens: f64,
        unreported: u64,
        denied: u64,
    }

    impl Envoy {
        fn apply(&mut self, change: Change) {
            match change {
                Change::Keep => {}
                Change::Deny => (self.size, self.tokens) = (None, 0.0),
                Change::Fresh(s) => (self.size, self.tokens) = (Some(s), f64::from(s)),
                Change::Resize(s) => {
                    self.tokens = match self.size {
                        Some(old) => self.tokens * f64::from(s) / f64::from(old),
                        None => f64::from(s),
                    };
                    self.size = Some(s);
                }
            }
        }

        fn spend(&mut self, n: u64) {
            for _ in 0..n {
                if self.tokens >= 1.0 {
                    self.tokens -= 1.0;
                    self.unreported += 1;
                } else {
                    self.denied += 1;
                }
            }
        }

        fn report(&mut self, h: &mut Holding) {
            h.report(std::mem::take(&mut self.unreported), std::mem::take(&mut self.denied));
        }

        /// What it may still admit plus what it admitted unreported never exceeds the exposure.
        fn check(&self, h: &Holding) {
            let exposed = self.tokens.floor() as u64 + self.unreported;
            assert!(exposed <= h.exposure(), "the Envoy has {exposed}, sluice counts {h:?}");
        }
    }

    #[test]
    fn a_first_grant_starts_full_and_a_report_takes_what_was_spent() {
        let (mut h, mut e) = (Holding::default(), Envoy::default());
        e.apply(h.resize(10, false, Some(0.0)));
        assert_eq!((e.size, h.exposure()), (Some(10), 10));
        e.spend(4);
        e.report(&mut h);
        assert_eq!(h.exposure(), 6);
        assert_eq!(h.resize(6, false, Some(0.0)), Change::Keep);
        // Growing a bucket that may hold more than is added scales it: 6 → 10 tokens, a size of 10 * 10 / 6.
        let grow = h.resize(10, false, Some(0.0));
        assert_eq!(grow, Change::Resize(16));
        e.apply(grow);
        e.check(&h);
        assert!(e.tokens <= 10.0 && e.tokens > 9.0, "{}", e.tokens);
        // A denial says the bucket is spent: the next grant starts a new one.
        e.spend(20);
        e.report(&mut h);
        assert_eq!(h.exposure(), 0, "{h:?}");
        assert_eq!(
            h.resize(30, false, Some(0.0)),
            Change::Fresh(29),
            "its last fraction of a token still counts"
        );
    }

    #[test]
    fn a_bucket_spent_to_empty_is_refilled_not_scaled() {
        let (mut h, mut e) = (Holding::default(), Envoy::default());
        e.apply(h.resize(10, false, Some(0.0)));
        e.spend(3);
        // Shrunk to 4 tokens: the Envoy's 7 become 7 * 4 / 10 = 2.8.
        let shrink = h.resize(4, false, Some(0.0));
        e.apply(shrink);
        e.spend(5);
        e.report(&mut h);
        assert!(e.tokens < 1.0 && e.tokens > 0.0, "{}", e.tokens);
        // It denied requests: its bucket holds a fraction of a token, which scaling would only multiply.
        let grow = h.resize(20, true, Some(0.0));
        assert!(matches!(grow, Change::Fresh(_)), "{grow:?}");
        e.apply(grow);
        e.check(&h);
        // It holds what it was granted, less the token its dry bucket may still hold by sluice's bound.
        assert!(e.tokens >= 18.0, "{}", e.tokens);
    }

    #[test]
    fn a_shrink_keeps_the_exposure_until_the_next_report() {
        let (mut h, mut e) = (Holding::default(), Envoy::default());
        e.apply(h.resize(100, false, Some(0.0)));
        e.spend(30);
        // Told to hold 40: its bucket shrinks, but the 30 it may have admitted stay exposed.
        let shrink = h.resize(40, false, Some(0.0));
        assert_eq!(shrink, Change::Resize(40));
        e.apply(shrink);
        e.check(&h);
        assert_eq!(h.exposure(), 100);
        e.report(&mut h);
        e.check(&h);
        assert!(h.exposure() <= 40, "{h:?}");
    }

    #[test]
    fn growing_a_spent_bucket_starts_a_new_one_of_what_is_added() {
        let (mut h, mut e) = (Holding::default(), Envoy::default());
        e.apply(h.resize(5, false, Some(0.0)));
        e.spend(5);
        e.report(&mut h);
        e.spend(1);
        // Spent and denied: a new bucket.
        e.report(&mut h);
        let grow = h.resize(7, false, Some(0.0));
        assert_eq!(grow, Change::Fresh(7));
        e.apply(grow);
        e.check(&h);
        e.spend(3);
        e.report(&mut h);
        e.check(&h);
        assert_eq!(h.exposure(), 4, "{h:?}");
    }

    #[test]
    fn nothing_granted_is_a_deny_all() {
        let (mut h, mut e) = (Holding::default(), Envoy::default());
        e.apply(h.resize(8, false, Some(0.0)));
        e.spend(2);
        assert_eq!(h.resize(0, false, Some(0.0)), Change::Deny);
        e.apply(Change::Deny);
        e.check(&h);
        e.report(&mut h);
        assert_eq!(h.exposure(), 0);
    }

    /// Every interleaving of spends, resizes both ways and reports, from a small deterministic generator: the Envoy
    /// never holds more than sluice counts.
    #[test]
    fn the_exposure_bounds_the_envoy_whatever_the_order() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..500 {
            let (mut h, mut e) = (Holding::default(), Envoy::default());
            let mut history = Vec::new();
            for _ in 0..60 {
                match next(4) {
                    0 => {
                        let n = next(40);
                        e.spend(n);
                        history.push(format!("spend {n}"));
                    }
                    1 => {
                        e.report(&mut h);
                        history.push("report".into());
                    }
                    2 => {
                        let (g, reported) = (next(200), next(2) == 0);
                        let change = h.resize(g, reported, (next(3) > 0).then(|| next(50) as f64));
                        e.apply(change);
                        history.push(format!("grant {g}: {change:?}"));
                    }
                    _ => {
                        if next(8) == 0 {
                            h.drop_bucket();
                            e.apply(Change::Deny);
                            history.push("lapse".into());
                        }
                    }
                }
                let exposed = e.tokens.floor() as u64 + e.unreported;
                assert!(
                    exposed <= h.exposure(),
                    "the Envoy has {exposed}, sluice counts {h:?} after {history:?}"
                );
            }
        }
    }
}
