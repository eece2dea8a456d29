//! A stream's messages ([`Quotas::report`]): each checked, its buckets' usage charged to their quotas, and an
//! assignment answered for every bucket it names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Quotas;
use super::grant::{Due, is_rate, settings_of};
use super::stream::{QuotaStream, Watch};
use super::vocabulary::{Action, BucketId, QuotaError, Report, ReportedUsage, Strategy};
use crate::limiter::{Charged, LimitError, Usage};
use crate::metrics::MAX_COUNTED;
use crate::rules::InitialAssignment;
use crate::store::{Announcements, Counters, Grants};

impl<S: Counters + Announcements + Grants> Quotas<S> {
    /// Charges one message's usage and answers with an assignment for each bucket it names.
    pub async fn report(&self, stream: &mut QuotaStream, report: Report) -> Result<Vec<Action>, QuotaError> {
        let domain = self.check(stream, &report)?;
        let now = self.limiter.now_us();
        let usages = merged(report.usages);
        let new = usages
            .iter()
            .filter(|u| !stream.buckets.contains_key(&u.bucket))
            .count();
        if stream.buckets.len() + new > self.caps.max_buckets_per_stream {
            return Err(QuotaError::OverCap(format!(
                "bucket_quota_usages: the stream would report {} buckets, over the cap of {} (--rlqs-max-buckets)",
                stream.buckets.len() + new,
                self.caps.max_buckets_per_stream
            )));
        }
        // Each bucket's amounts counted as at most MAX_COUNTED, and summed without wrapping: a counter never goes
        // backwards, whatever a client reports.
        let (mut allowed, mut denied) = (0u64, 0u64);
        for u in &usages {
            allowed = allowed.saturating_add(u.allowed.min(MAX_COUNTED));
            denied = denied.saturating_add(u.denied.min(MAX_COUNTED));
        }
        self.stats.allowed.increment(allowed);
        self.stats.denied.increment(denied);
        let charged = self.charge(&domain, &usages).await?;

        let mut actions = Vec::with_capacity(usages.len());
        let mut due = Vec::with_capacity(usages.len());
        for (usage, charged) in usages.into_iter().zip(charged) {
            let Some(charged) = charged else { continue };
            let refused = wrongful(&usage, &charged);
            if let (Charged::Limited(state), true) = (&charged, refused > 0) {
                self.limiter
                    .metrics()
                    .rlqs_wrongful_denials(&domain, &state.rule)
                    .increment(refused);
            }
            let action = self.take_usage(stream, &usage, &charged, now);
            if let Some(watch) = stream.buckets.get_mut(&usage.bucket) {
                watch.wrongful = watch.wrongful.saturating_add(refused);
            }
            match action {
                Some(action) => actions.push(action),
                None => due.push(Due {
                    bucket: usage.bucket,
                    charged,
                    report: Some((usage.allowed, usage.denied)),
                }),
            }
        }
        actions.extend(self.size(stream, &domain, due, now, true).await);
        self.stats.buckets.set(self.watched.load(Ordering::Relaxed) as f64);
        self.post(stream, &actions);
        Ok(actions)
    }

    /// Takes a bucket's charged usage into the stream's watch of it, opened by its first report. A bucket whose
    /// rule sets its initial assignment gets that assignment at once, on its first report; the others are sized.
    fn take_usage(&self, stream: &mut QuotaStream, usage: &Usage, charged: &Charged, now: u64) -> Option<Action> {
        let requests = usage.allowed.saturating_add(usage.denied);
        let first = !stream.buckets.contains_key(&usage.bucket);
        let settings = settings_of(charged);
        let watch = stream
            .buckets
            .entry(usage.bucket.clone())
            .or_insert_with(|| Watch::new(settings, now));
        watch.settings = settings;
        watch.demand.add(now, requests);
        if requests > 0 {
            watch.active_us = now;
        }
        let strategy = match settings.initial {
            InitialAssignment::AllowAll if first => Strategy::AllowAll,
            InitialAssignment::DenyAll if first => Strategy::DenyAll,
            _ => return None,
        };
        watch.consume(now, usage.allowed, usage.denied);
        let action = self.assign(watch, usage.bucket.clone(), strategy, settings.assignment_ttl_s, false);
        self.record(watch, &action, now);
        Some(action)
    }

    /// Checks a message and returns the stream's domain (set by its first message).
    fn check(&self, stream: &mut QuotaStream, report: &Report) -> Result<Arc<str>, QuotaError> {
        let cap = self.caps.max_value_bytes;
        let over = |field: String, len: usize| {
            QuotaError::Invalid(format!(
                "{field} is {len} bytes, over the cap of {cap} (--max-value-bytes)"
            ))
        };
        let domain = match (&stream.domain, report.domain.as_str()) {
            (Some(d), "") => d.clone(),
            (Some(d), sent) if **d == *sent => d.clone(),
            (Some(d), sent) => {
                return Err(QuotaError::Invalid(format!(
                    "domain: '{sent}' differs from the stream's domain '{d}'"
                )));
            }
            (None, "") => {
                return Err(QuotaError::Invalid(
                    "domain: empty in the stream's first message".into(),
                ));
            }
            (None, sent) if sent.len() > cap => return Err(over("domain".into(), sent.len())),
            (None, sent) => {
                let d: Arc<str> = Arc::from(sent);
                stream.domain = Some(d.clone());
                d
            }
        };
        if report.usages.is_empty() {
            return Err(QuotaError::Invalid("bucket_quota_usages: empty".into()));
        }
        for (i, usage) in report.usages.iter().enumerate() {
            let at = format!("bucket_quota_usages[{i}].bucket_id.bucket");
            if usage.bucket.is_empty() {
                return Err(QuotaError::Invalid(format!("{at}: the bucket id has no entries")));
            }
            for (k, v) in &usage.bucket {
                if k.is_empty() {
                    return Err(QuotaError::Invalid(format!("{at}: a key is empty")));
                }
                if k.len() > cap {
                    return Err(over(format!("{at}: key '{}…'", truncated(k)), k.len()));
                }
                if v.len() > cap {
                    return Err(over(format!("{at}['{}']", truncated(k)), v.len()));
                }
            }
        }
        Ok(domain)
    }

    /// Charges usages; `None` where a bucket's counters could not be reached (its Envoy keeps its assignment until
    /// the TTL lapses, then follows its own expired-assignment behaviour).
    pub(super) async fn charge(&self, domain: &str, usages: &[Usage]) -> Result<Vec<Option<Charged>>, QuotaError> {
        match self.limiter.buckets().charge(domain, usages).await {
            Ok(answers) => Ok(answers
                .into_iter()
                .map(|a| {
                    a.inspect_err(|e| tracing::warn!(error = %e, "an RLQS report could not be charged"))
                        .ok()
                })
                .collect()),
            Err(LimitError::Store(e)) => Err(QuotaError::Unavailable(e.to_string())),
            Err(e) => Err(QuotaError::Invalid(e.to_string())),
        }
    }
}

/// How many of a report's denials its bucket's quota, a budget, still had room for once the report was charged: the
/// requests refused while quota was left (its limits' least remaining, at most [`MAX_COUNTED`]).
fn wrongful(usage: &Usage, charged: &Charged) -> u64 {
    match charged {
        Charged::Limited(state) if !state.shadow && usage.denied > 0 && !is_rate(state) => {
            let left = state.tiers.iter().map(|t| t.remaining).min().unwrap_or(0);
            usage.denied.min(left).min(MAX_COUNTED)
        }
        _ => 0,
    }
}

/// A message's usages, one per bucket (entries sorted by key): the same bucket twice in one message is one report
/// of both.
fn merged(reported: Vec<ReportedUsage>) -> Vec<Usage> {
    let mut usages: Vec<Usage> = Vec::with_capacity(reported.len());
    let mut seen: HashMap<BucketId, usize> = HashMap::with_capacity(reported.len());
    for reported in reported {
        let mut bucket = reported.bucket;
        bucket.sort_unstable();
        match seen.get(&bucket) {
            // The same bucket twice in one message: one report of both.
            Some(&i) => {
                let u = &mut usages[i];
                u.allowed = u.allowed.saturating_add(reported.allowed);
                u.denied = u.denied.saturating_add(reported.denied);
            }
            None => {
                seen.insert(bucket.clone(), usages.len());
                usages.push(Usage {
                    bucket,
                    allowed: reported.allowed,
                    denied: reported.denied,
                });
            }
        }
    }
    usages
}

fn truncated(s: &str) -> &str {
    let mut end = s.len().min(32);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
