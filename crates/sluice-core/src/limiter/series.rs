//! Outcomes per second: per domain and rule, how many decisions each second allowed and denied, and how many costs
//! were reported (a cost budget's Report, counted whatever the limits say: no decision), summed across the
//! instances on one store; what the dashboard plots. Each instance counts in memory and adds its counts to the
//! store once a second ([`Series::series_add`](crate::store::Series::series_add): in Redis a hash per domain and second, gone after 16 minutes).
//! With them it adds a heartbeat, its name in a hash per second of its own, so that a reader can tell how many
//! instances add to the sums.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Limiter;
use super::decision::LimitError;
use crate::store::{self, Announcements, CounterKey, Counters};

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
    fn take(&self) -> HashMap<Arc<str>, Vec<(u64, String, u64)>> {
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

/// The set of per-second hashes the heartbeats go to, as if it were a domain's: a domain's name cannot be empty, so no
/// domain's outcomes share it. One set for every domain: an instance writes one heartbeat a second, however many
/// domains it has.
const HEARTBEATS: &str = "";

/// How often the counts are added to the store, and how often the top offenders are (see `offenders`).
const EVERY: Duration = Duration::from_secs(1);

impl<S: Counters + Announcements + store::Series + store::Offenders> Limiter<S> {
    /// Adds this instance's counts to the store for as long as the limiter lives: the outcomes every second, the top
    /// offenders every [`FLUSH_EVERY`](super::FLUSH_EVERY). Run it once per limiter, in a task of its own.
    pub async fn keep_tallies(self: Arc<Self>) {
        // The first tick a second from now: at start there is nothing to add, not even a heartbeat worth a key.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let per_offenders_flush = (super::FLUSH_EVERY.as_secs() / EVERY.as_secs()).max(1);
        for n in 1u64.. {
            tick.tick().await;
            self.flush_series().await;
            if n % per_offenders_flush == 0 {
                self.flush_offenders().await;
            }
        }
    }
}

impl<S: Counters + Announcements + store::Series> Limiter<S> {
    /// Adds the outcomes counted since the last flush to the store now, and this instance's heartbeat for the current
    /// second (what a failed flush held is dropped and logged).
    pub async fn flush_series(&self) {
        let mut taken = self.outcomes.take();
        let beat = (self.clock.now_us() / 1_000_000, self.instance.to_string(), 1);
        taken.entry(Arc::from(HEARTBEATS)).or_default().push(beat);
        for (domain, counts) in taken {
            let set = CounterKey::series(&self.settings.key_prefix, &domain);
            if let Err(e) = self.store().series_add(&set, &counts).await {
                tracing::warn!(error = %e, domain = %domain, "outcomes of the last second not stored");
            }
        }
    }

    /// The instances sharing the store whose heartbeat is in the last `seconds` seconds (the current one included),
    /// by name ([`Limiter::instance`]), each with the last second it was seen. An instance beats once a second.
    pub async fn instances_seen(&self, seconds: u64) -> Result<BTreeMap<String, u64>, LimitError> {
        let now = self.clock.now_us() / 1_000_000;
        let from = now + 1 - seconds.max(1);
        let set = CounterKey::series(&self.settings.key_prefix, HEARTBEATS);
        let hashes = self.store().series_read(&set, from, now).await?;
        let mut seen = BTreeMap::new();
        for (i, hash) in hashes.into_iter().enumerate() {
            for instance in hash.into_keys() {
                seen.insert(instance, from + i as u64);
            }
        }
        Ok(seen)
    }

    /// The outcomes of `domain`'s rules over the last `seconds` seconds (the current one included), summed across
    /// every instance sharing the store.
    pub async fn series(&self, domain: &str, seconds: u64) -> Result<Series, LimitError> {
        if self.rules().domain(domain).is_none() {
            return Err(LimitError::NotFound(format!(
                "domain: no domain '{domain}' is configured"
            )));
        }
        let now = self.clock.now_us() / 1_000_000;
        let from = now + 1 - seconds.max(1);
        let set = CounterKey::series(&self.settings.key_prefix, domain);
        let hashes = self.store().series_read(&set, from, now).await?;
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
        Ok(series)
    }
}
