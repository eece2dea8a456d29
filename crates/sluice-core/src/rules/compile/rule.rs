//! The rule of one node compiled: its `rate_limit` (or `rate_limits`, all decided together), what it `replaces`,
//! the hit records it keeps, and its flags.

use std::sync::Arc;

use super::Compiler;
use crate::config::{ConfigError, RawDescriptor, RawRateLimit, RawRecord};
use crate::rules::tree::Rule;
use crate::rules::vocabulary::{MAX_RECORDS, Record, Tier};

impl Compiler<'_> {
    /// The rule of the descriptor `raw` at `here` (metric label `label`, built from the request when `dynamic`);
    /// `None` when it sets no limit. Its `metadata` is left to the caller, which owns the descriptor.
    pub(in crate::rules) fn rule(
        &self,
        raw: &RawDescriptor,
        here: &str,
        label: &Arc<str>,
        dynamic: bool,
    ) -> Result<Option<Rule>, ConfigError> {
        let Some((raws, base)) = self.limits_of(raw, here)? else {
            return Ok(None);
        };
        let several = raw.rate_limits.is_some();
        let mut tiers = Vec::with_capacity(raws.len());
        let mut replaces = Vec::new();
        let mut record = None;
        let mut unlimited = false;
        for (i, rl) in raws.iter().enumerate() {
            let at = if several { format!("{base}[{i}]") } else { base.clone() };
            let tier = self.tier(rl, &at)?;
            self.replaces(rl, &at, &mut replaces)?;
            if let Some(r) = &rl.record {
                if record.is_some() {
                    return Err(self.err(&format!("{at}.record"), "only one limit of a rule may keep records"));
                }
                record = Some(self.record(r, &at)?);
            }
            match tier {
                None if several => {
                    return Err(self.err(
                        &format!("{at}.unlimited"),
                        "an unlimited limit cannot be combined with others",
                    ));
                }
                None => unlimited = true,
                Some(t) => {
                    if let Some(other) = tiers.iter().position(|o: &Tier| {
                        o.limit.algorithm == t.limit.algorithm
                            && o.limit.window_us() == t.limit.window_us()
                            && o.cost == t.cost
                    }) {
                        return Err(self.err(
                            &at,
                            format!("same algorithm and window as {base}[{other}]; merge them into one limit"),
                        ));
                    }
                    tiers.push(t);
                }
            }
        }
        let name = if unlimited {
            raws[0].name.as_deref().filter(|n| !n.is_empty()).map(Arc::from)
        } else {
            tiers.iter().find_map(|t| t.name.clone())
        };
        Ok(Some(Rule {
            tiers: tiers.into(),
            name,
            replaces: replaces.into(),
            shadow_mode: raw.shadow_mode,
            quota_mode: raw.quota_mode,
            cost_reports: raw.cost_reports,
            record,
            path: Arc::clone(label),
            dynamic_label: dynamic || raw.detailed_metric,
            detailed_metric: raw.detailed_metric,
            // Set by the caller, which owns the descriptor.
            metadata: None,
            stats: std::sync::OnceLock::new(),
            bucket: None,
        }))
    }

    /// The limits of the descriptor `raw` at `here`, and the path they are named by; `None` when it sets none.
    fn limits_of<'r>(
        &self,
        raw: &'r RawDescriptor,
        here: &str,
    ) -> Result<Option<(Vec<&'r RawRateLimit>, String)>, ConfigError> {
        Ok(Some(match (&raw.rate_limit, &raw.rate_limits) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(self.err(
                    &format!("{here}.rate_limits"),
                    "use either rate_limit or rate_limits, not both",
                ));
            }
            (Some(one), None) => (vec![&**one], format!("{here}.rate_limit")),
            (None, Some(list)) => {
                if list.is_empty() {
                    return Err(self.err(&format!("{here}.rate_limits"), "the list of limits is empty"));
                }
                (list.iter().collect(), format!("{here}.rate_limits"))
            }
        }))
    }

    /// Adds the names the limit at `at` `replaces` to `replaces`: neither empty nor its own.
    fn replaces(&self, rl: &RawRateLimit, at: &str, replaces: &mut Vec<Arc<str>>) -> Result<(), ConfigError> {
        for (j, r) in rl.replaces.iter().enumerate() {
            let at = format!("{at}.replaces[{j}].name");
            if r.name.is_empty() {
                return Err(self.err(&at, "replaces entry is empty"));
            }
            if rl.name.as_deref() == Some(r.name.as_str()) {
                return Err(self.err(&at, format!("a rule cannot replace itself ('{}')", r.name)));
            }
            replaces.push(Arc::from(r.name.as_str()));
        }
        Ok(())
    }

    /// The `record` of the limit at `at`: an entry key, and how many of its latest values to keep.
    fn record(&self, r: &RawRecord, at: &str) -> Result<Record, ConfigError> {
        if r.key.is_empty() {
            return Err(self.err(&format!("{at}.record.key"), "the entry key to record is empty"));
        }
        if r.size == 0 || r.size > MAX_RECORDS {
            return Err(self.err(
                &format!("{at}.record.size"),
                format!("must be between 1 and {MAX_RECORDS}"),
            ));
        }
        Ok(Record {
            key: Arc::from(r.key.as_str()),
            size: r.size,
        })
    }
}
