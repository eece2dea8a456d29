//! Outcomes per second: per domain and rule, how many decisions each second allowed and denied, and how many costs
//! were reported (a cost budget's Report, counted whatever the limits say: no decision), summed across the
//! instances on one store; what the dashboard plots. Each instance counts in memory and adds its counts to the
//! store once a second ([`Series::series_add`](crate::store::Series::series_add): in Redis a hash per domain and second, gone after 16 minutes).
//! With them it adds a heartbeat, its name in a hash per second of its own, so that a reader can tell how many
//! instances add to the sums ([`Tallies`](super::Tallies) adds them and reads them back).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// What one counted hit was: a decision that allowed it, one that denied it, or a reported cost (counted whatever the
/// limits say, so neither).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Noted {
    Allowed,
    Denied,
    Reported,
}

impl Noted {
    /// The field prefix of its counts in a second's hash, and its place in [`Counted::counts`].
    const FIELDS: [&'static str; 3] = ["a", "d", "r"];

    fn index(self) -> usize {
        match self {
            Noted::Allowed => 0,
            Noted::Denied => 1,
            Noted::Reported => 2,
        }
    }
}

/// The seconds counted since the last flush: per rule and second, allowed, denied and reported. A rule is found by the
/// address of its path (one allocation per rule of a rule set: no string is hashed on the decision path), and
/// carries its domain and path for the flush.
#[derive(Default)]
pub(crate) struct Outcomes {
    noted: Mutex<HashMap<(usize, u64), Counted>>,
}

/// One rule's counts for one second.
struct Counted {
    domain: Arc<str>,
    rule: Arc<str>,
    counts: [u64; 3],
}

impl Outcomes {
    pub(crate) fn note(&self, domain: &Arc<str>, rule: &Arc<str>, now_us: u64, what: Noted) {
        self.note_many(domain, rule, now_us, what, 1);
    }

    /// Notes `n` outcomes alike at once (an RLQS report's allowed or denied requests).
    pub(crate) fn note_many(&self, domain: &Arc<str>, rule: &Arc<str>, now_us: u64, what: Noted, n: u64) {
        if n == 0 {
            return;
        }
        let mut noted = self.noted.lock().unwrap_or_else(|p| p.into_inner());
        let key = (Arc::as_ptr(rule) as *const u8 as usize, now_us / 1_000_000);
        let counted = noted.entry(key).or_insert_with(|| Counted {
            domain: domain.clone(),
            rule: rule.clone(),
            counts: [0; 3],
        });
        let count = &mut counted.counts[what.index()];
        *count = count.saturating_add(n);
    }

    /// What was counted, per domain: `(second, field, n)` with fields `a:<rule>` (allowed), `d:<rule>` (denied) and
    /// `r:<rule>` (reported).
    pub(super) fn take(&self) -> HashMap<Arc<str>, Vec<(u64, String, u64)>> {
        let noted = std::mem::take(&mut *self.noted.lock().unwrap_or_else(|p| p.into_inner()));
        let mut out: HashMap<Arc<str>, Vec<(u64, String, u64)>> = HashMap::new();
        for ((_, second), Counted { domain, rule, counts }) in noted {
            let fields = out.entry(domain).or_default();
            for (kind, n) in Noted::FIELDS.iter().zip(counts) {
                if n > 0 {
                    fields.push((second, format!("{kind}:{rule}"), n));
                }
            }
        }
        out
    }
}

/// A domain's outcomes over consecutive seconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Series {
    /// The first second (since the Unix epoch).
    pub from: u64,
    /// Per rule path: allowed and denied per second, from `from` on.
    pub rules: BTreeMap<String, (Vec<u64>, Vec<u64>)>,
    /// Per rule path with any: the costs reported per second (cost budgets' Reports, counted whatever the limits
    /// say), from `from` on. A report is no decision: it is in neither `rules`' allowed nor denied.
    pub reported: BTreeMap<String, Vec<u64>>,
}

impl Series {
    /// A domain's series from `from` on, out of the store's hashes of its seconds (one per second, in order).
    pub(super) fn from_hashes(from: u64, hashes: Vec<HashMap<String, u64>>) -> Series {
        let len = hashes.len();
        let mut series = Series {
            from,
            ..Series::default()
        };
        for (i, hash) in hashes.into_iter().enumerate() {
            for (field, n) in hash {
                let Some((kind, rule)) = field.split_once(':') else {
                    continue;
                };
                if kind == Noted::FIELDS[Noted::Reported.index()] {
                    series.reported.entry(rule.to_string()).or_insert_with(|| vec![0; len])[i] += n;
                    continue;
                }
                let (allowed, denied) = series
                    .rules
                    .entry(rule.to_string())
                    .or_insert_with(|| (vec![0; len], vec![0; len]));
                match kind {
                    "a" => allowed[i] += n,
                    "d" => denied[i] += n,
                    _ => {}
                }
            }
        }
        series
    }
}
