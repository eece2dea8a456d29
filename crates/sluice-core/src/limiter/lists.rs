//! Lists at run time: what a deny or allow list holds beyond its configuration. Two sources feed it:
//!
//! - entries managed through the admin API ([`Lists::add_entries`]), kept in the store (in Redis a sorted
//!   set per list, each value scored by its expiry), so every instance on one Redis shares them. The instance that
//!   changes a list announces the change and reads it back; the others read it when the notice arrives, every
//!   second while notices may be missed ([`Announcements::hearing`](crate::store::Announcements::hearing)), and every 30 seconds whatever happens (a notice never
//!   sent because its caller was cancelled between the write and the announcement), so a change is in force
//!   everywhere within a second, and within 30 seconds at worst. An entry's expiry is read on the limiter's clock:
//!   the list is read again when its first entry expires.
//! - the values last fetched from a list's URL ([`Lists::set_fetched`]), by whoever fetches them (the server's
//!   list refresher).
//!
//! Both are compiled into [`Matcher`]s beside the configured values, swapped in whole, and found by domain and list
//! name on the decision path (one hash lookup per list a descriptor key has).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;

use super::core::Core;
use super::decision::LimitError;
use crate::rules::{ListSource, LiveList, Matcher, RuleSet, check_value};
use crate::store::{self, Announcements, CounterKey, Counters, ListChange, ListEntry, Notice};

/// The most run-time entries one list may hold.
pub const MAX_LIST_ENTRIES: usize = 1_000_000;
/// How often every managed list is read again whatever the notices say: the bound on a change whose notice was lost.
const SWEEP: Duration = Duration::from_secs(30);

/// The most values one call may add or remove: 1 000 of the longest address or range (49 characters, an IPv6 range
/// written with an IPv4 tail) encode in about 51 KB, within the default `--max-request-bytes` of 64 KiB.
pub const MAX_LIST_VALUES_PER_CALL: usize = 1_000;

/// What the lists hold at run time, over the store's [`Lists`](store::Lists): the entries managed through the admin
/// API and the values fetched from the lists' URLs, put in force in the core's live lists.
pub struct Lists<S> {
    core: Arc<Core<S>>,
    /// The managed lists of the rules in force.
    followed: std::sync::Mutex<Followed>,
    /// The lists whose last fetch failed, by (domain, list): why.
    failed: std::sync::Mutex<HashMap<ListName, String>>,
}

/// A list by its domain and name.
type ListName = (Arc<str>, Arc<str>);

/// The managed lists of the rules in force, by store key.
#[derive(Default)]
struct Followed {
    /// The rule set they were taken from (by address).
    rules: usize,
    lists: HashMap<String, Managed>,
}

struct Managed {
    domain: Arc<str>,
    name: Arc<str>,
    key: CounterKey,
    /// Read again at this time (its first entry's expiry), or at once when `None` and stale.
    next_read_us: Option<u64>,
    stale: bool,
}

impl<S> Lists<S> {
    pub(super) fn new(core: Arc<Core<S>>) -> Lists<S> {
        Lists {
            core,
            followed: std::sync::Mutex::default(),
            failed: std::sync::Mutex::default(),
        }
    }

    fn update(&self, domain: &Arc<str>, name: &Arc<str>, change: impl Fn(&mut LiveList)) {
        self.core.live_lists.rcu(|all| {
            let mut all = HashMap::clone(all);
            let lists = all.entry(domain.clone()).or_default();
            change(lists.entry(name.clone()).or_default());
            all
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Followed> {
        self.followed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, HashMap<ListName, String>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

// The values fetched from the lists' URLs, and the lists the rules in force name: nothing asked of the store.
impl<S: Counters + Announcements> Lists<S> {
    /// Puts the values fetched for the list `name` of `domain` in force, replacing the last ones, and clears a
    /// failure reported for it.
    pub fn set_fetched(&self, domain: &str, name: &str, values: Arc<Matcher>) {
        self.core.metrics.list_fetched(domain, name, Some(values.len()));
        self.update(&Arc::from(domain), &Arc::from(name), |l| {
            l.fetched = Some(values.clone())
        });
        let mut failed = self.failed();
        failed.remove(&(Arc::from(domain), Arc::from(name)));
    }

    /// Records that fetching the list `name` of `domain` failed (`why` names the URL): the last values stay, and
    /// [`Lists::failures`] reports it until a fetch succeeds.
    pub fn fetch_failed(&self, domain: &str, name: &str, why: String) {
        self.core.metrics.list_fetched(domain, name, None);
        let mut failed = self.failed();
        failed.insert((Arc::from(domain), Arc::from(name)), why);
    }

    /// The lists of the rules in force whose last fetch failed, as `list domain/name: why` lines, sorted.
    pub fn failures(&self) -> Vec<String> {
        let rules = self.core.rules();
        let failed = self.failed();
        let mut lines: Vec<String> = failed
            .iter()
            .filter(|((d, l), _)| {
                rules
                    .domain(d)
                    .is_some_and(|d| d.lists.get(l).is_some_and(|l| l.source.is_some()))
            })
            .map(|((d, l), why)| format!("list {d}/{l}: {why}"))
            .collect();
        lines.sort();
        lines
    }

    /// The values fetched for the list `name` of `domain`, if any.
    pub fn fetched(&self, domain: &str, name: &str) -> Option<Arc<Matcher>> {
        self.core.live_lists.load().get(domain)?.get(name)?.fetched.clone()
    }

    /// Every list of the rules in force that has a URL: its domain, its name and where it comes from.
    pub fn with_urls(&self) -> Vec<(Arc<str>, Arc<str>, ListSource)> {
        let rules = self.core.rules();
        rules
            .domains()
            .flat_map(|d| {
                d.lists
                    .iter()
                    .filter_map(|l| Some((d.name.clone(), l.name.clone(), l.source.clone()?)))
            })
            .collect()
    }

    /// The list `name` of `domain` in the rules in force, or NOT_FOUND naming what is missing.
    fn list_named(&self, rules: &RuleSet, domain: &str, name: &str) -> Result<CounterKey, LimitError> {
        let d = rules
            .domain(domain)
            .ok_or_else(|| LimitError::NotFound(format!("domain: no domain '{domain}' is configured")))?;
        d.lists
            .get(name)
            .ok_or_else(|| LimitError::NotFound(format!("list: domain '{domain}' has no list '{name}'")))?;
        Ok(self.list_key(domain, name))
    }

    fn list_key(&self, domain: &str, name: &str) -> CounterKey {
        CounterKey::list(&self.core.settings.key_prefix, domain, name)
    }

    fn stale_all(&self) {
        self.lock().lists.values_mut().for_each(|m| m.stale = true);
    }

    /// Follows the lists of the rules in force: a new one is read at once, one gone is forgotten.
    fn follow_rules(&self) {
        let rules = self.core.rules();
        let mut followed = self.lock();
        let address = Arc::as_ptr(&rules) as usize;
        if followed.rules == address {
            return;
        }
        followed.rules = address;
        let mut lists = HashMap::new();
        for domain in rules.domains() {
            for list in domain.lists.iter() {
                let key = self.list_key(&domain.name, &list.name);
                let managed = followed.lists.remove(key.as_str()).unwrap_or(Managed {
                    domain: domain.name.clone(),
                    name: list.name.clone(),
                    key: key.clone(),
                    next_read_us: None,
                    stale: true,
                });
                lists.insert(key.as_str().to_string(), managed);
            }
        }
        let gone: Vec<(Arc<str>, Arc<str>)> = followed.lists.drain().map(|(_, m)| (m.domain, m.name)).collect();
        followed.lists = lists;
        drop(followed);
        if !gone.is_empty() {
            self.core.live_lists.rcu(|all| {
                let mut all = HashMap::clone(all);
                for (domain, name) in &gone {
                    if let Some(lists) = all.get_mut(domain) {
                        lists.remove(name);
                    }
                }
                all
            });
        }
    }
}

// The entries managed through the admin API, kept in the store.
impl<S: Counters + Announcements + store::Lists> Lists<S> {
    /// Adds `values` to the list `name` of `domain` (or renews them) for `ttl_us`, or for good; returns how many
    /// were new. Every instance sharing the store holds them within a second.
    pub async fn add_entries(
        &self,
        domain: &str,
        name: &str,
        values: &[String],
        ttl_us: Option<u64>,
    ) -> Result<u64, LimitError> {
        check_values(values, self.core.settings.caps.max_value_bytes)?;
        let now_us = self.core.clock.now_us();
        let expires_us = ttl_us.filter(|&t| t > 0).map(|t| now_us.saturating_add(t));
        let change = ListChange::Add {
            values,
            expires_us,
            max: MAX_LIST_ENTRIES,
        };
        self.change_list(domain, name, now_us, change).await
    }

    /// Removes `values` from the run-time entries of the list `name` of `domain`; returns how many were there.
    /// Configured and fetched values stay.
    pub async fn remove_entries(&self, domain: &str, name: &str, values: &[String]) -> Result<u64, LimitError> {
        check_values(values, self.core.settings.caps.max_value_bytes)?;
        let now_us = self.core.clock.now_us();
        self.change_list(domain, name, now_us, ListChange::Remove { values })
            .await
    }

    async fn change_list(
        &self,
        domain: &str,
        name: &str,
        now_us: u64,
        change: ListChange<'_>,
    ) -> Result<u64, LimitError> {
        let key = self.list_named(&self.core.rules(), domain, name)?;
        let changed = self
            .core
            .store()
            .list_change(now_us, &key, change)
            .await?
            .ok_or_else(|| {
                LimitError::InvalidArgument(format!(
                    "values: list '{name}' would hold more than {MAX_LIST_ENTRIES} run-time entries"
                ))
            })?;
        // The others first: the change is made, whatever happens to this call from here on.
        self.core
            .store()
            .announce(Notice::Lists(vec![key.as_str().to_string()]))
            .await;
        if let Err(e) = self.read_list(&Arc::from(domain), &Arc::from(name), &key).await {
            // In force here once the keeper reads it (the notice just sent marked it stale).
            tracing::debug!(list = %name, error = %e, "a changed list not read back; the keeper reads it");
        }
        Ok(changed)
    }

    /// The run-time entries of the list `name` of `domain` that have not expired, by value.
    pub async fn entries(&self, domain: &str, name: &str) -> Result<Vec<ListEntry>, LimitError> {
        let key = self.list_named(&self.core.rules(), domain, name)?;
        let mut entries = self.core.store().list_entries(self.core.clock.now_us(), &key).await?;
        entries.sort_by(|a, b| a.value.cmp(&b.value));
        Ok(entries)
    }

    /// Reads a managed list from the store and puts it in force.
    async fn read_list(&self, domain: &Arc<str>, name: &Arc<str>, key: &CounterKey) -> Result<(), LimitError> {
        let entries = self.core.store().list_entries(self.core.clock.now_us(), key).await?;
        let next_read_us = entries.iter().filter_map(|e| e.expires_us).min();
        let values = entries.iter().enumerate().filter(|(_, e)| match check_value(&e.value) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(list = %name, value = %e.value, why, "a stored list entry that is not a value was skipped");
                false
            }
        });
        let matcher = Matcher::new(values.map(|(i, e)| (i, e.value.as_str())))
            .ok()
            .map(Arc::new);
        let matcher = matcher.filter(|m| !m.is_empty());
        self.core
            .metrics
            .list_entries(domain, name, "managed", matcher.as_ref().map_or(0, |m| m.len()));
        self.update(domain, name, |l| l.managed = matcher.clone());
        if let Some(m) = self.lock().lists.get_mut(key.as_str()) {
            m.next_read_us = next_read_us;
            m.stale = false;
        }
        Ok(())
    }

    /// Reads every managed list of the rules in force from the store and puts it in force. A server calls it before
    /// it answers or reports ready, so that a new instance never decides without the run-time entries already
    /// stored; [`Lists::keep`] follows them from then on. The error names the first list that could not be
    /// read; it and the lists after it stay to be read by the keeper.
    pub async fn read_all(&self) -> Result<(), String> {
        self.follow_rules();
        let lists: Vec<(Arc<str>, Arc<str>, CounterKey)> = self
            .lock()
            .lists
            .values()
            .map(|m| (m.domain.clone(), m.name.clone(), m.key.clone()))
            .collect();
        for (domain, name, key) in lists {
            self.read_list(&domain, &name, &key)
                .await
                .map_err(|e| format!("list {domain}/{name}: its run-time entries cannot be read: {e}"))?;
        }
        Ok(())
    }

    /// Follows the managed lists for as long as the limiter lives: reads each when the rules bring it, when an
    /// instance announces a change to it, when its first entry expires, and every second while notices may be
    /// missed. Run it once per limiter, in a task of its own; it returns when the store's notices end.
    pub async fn keep(&self) {
        let mut notices = self.core.store().notices();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut polled = tokio::time::Instant::now();
        let mut swept = tokio::time::Instant::now();
        loop {
            tokio::select! {
                notice = notices.recv() => match notice {
                    Ok(Notice::Lists(keys)) => {
                        let mut followed = self.lock();
                        for key in keys {
                            if let Some(m) = followed.lists.get_mut(&key) {
                                m.stale = true;
                            }
                        }
                    }
                    Ok(Notice::Missed) | Err(RecvError::Lagged(_)) => self.stale_all(),
                    Ok(_) => {}
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    if !self.core.store().hearing() && polled.elapsed() >= Duration::from_secs(1) {
                        polled = tokio::time::Instant::now();
                        self.stale_all();
                    }
                    // A change whose notice was never sent (its caller cancelled between the write and the
                    // announcement) is in force everywhere within this sweep.
                    if swept.elapsed() >= SWEEP {
                        swept = tokio::time::Instant::now();
                        self.stale_all();
                    }
                }
            }
            self.follow_rules();
            let now_us = self.core.clock.now_us();
            let due: Vec<(Arc<str>, Arc<str>, CounterKey)> = self
                .lock()
                .lists
                .values()
                .filter(|m| m.stale || m.next_read_us.is_some_and(|t| t <= now_us))
                .map(|m| (m.domain.clone(), m.name.clone(), m.key.clone()))
                .collect();
            for (domain, name, key) in due {
                if let Err(e) = self.read_list(&domain, &name, &key).await {
                    // Stays stale: read again at the next tick.
                    tracing::debug!(list = %name, error = %e, "list entries not read; tried again");
                }
            }
        }
    }
}

/// Refuses a call's values that no list could hold (malformed, or longer than a descriptor value may be), naming
/// the first.
fn check_values(values: &[String], max_bytes: usize) -> Result<(), LimitError> {
    if values.is_empty() {
        return Err(LimitError::InvalidArgument("values: none given".into()));
    }
    if values.len() > MAX_LIST_VALUES_PER_CALL {
        return Err(LimitError::InvalidArgument(format!(
            "values: {} given, at most {MAX_LIST_VALUES_PER_CALL} per call",
            values.len()
        )));
    }
    for (i, value) in values.iter().enumerate() {
        if value.len() > max_bytes {
            return Err(LimitError::InvalidArgument(format!(
                "values[{i}]: {} bytes, longer than a descriptor value may be ({max_bytes})",
                value.len()
            )));
        }
        check_value(value).map_err(|why| LimitError::InvalidArgument(format!("values[{i}]: {why}")))?;
    }
    Ok(())
}
