//! The compiler: [`RuleSet::compile`] turns the shape-checked files of [`crate::config`] into one match tree per
//! domain, and a rule's YAML `metadata` into plain data.
//!
//! It rejects everything the reference rejects at load time, each error naming the file and the path of the offending
//! key (`config 'edge.yaml': descriptors[2].rate_limit.unit: unknown unit 'fortnight'`). What it returns cannot be
//! invalid, so the limiter never validates again.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{ConfigError, ConfigFile, RawDescriptor, RawRateLimit};
use crate::metrics::Metrics;

use super::RuleSet;
use super::pattern::Pattern;
use super::tree::{Domain, Node, Rule};
use super::vocabulary::{
    Algorithm, FailurePolicy, Limit, MAX_LOG_LIMIT, MAX_RECORDS, MAX_WINDOW_SECONDS, Record, Tier, TierCost, Unit,
};

/// What two files of one domain mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Domains {
    /// Each domain is defined by one file; a second file of the domain is an error naming both.
    #[default]
    OnePerFile,
    /// Files of one domain merge (the reference's `MERGE_DOMAIN_CONFIG`): their top-level descriptors and quota
    /// buckets join one tree, and a top-level descriptor defined in two files is an error naming both.
    Merged,
}

impl RuleSet {
    /// Compiles shape-checked files, one file per domain, rejecting what the reference rejects at load time.
    pub fn compile(files: &[ConfigFile], metrics: &Metrics) -> Result<RuleSet, ConfigError> {
        RuleSet::compile_with(files, metrics, Domains::OnePerFile)
    }

    /// Compiles shape-checked files; `domains` says whether files of one domain merge.
    pub fn compile_with(files: &[ConfigFile], metrics: &Metrics, mode: Domains) -> Result<RuleSet, ConfigError> {
        RuleSet::compile_owned(files.to_vec(), metrics, mode)
    }

    /// Compiles shape-checked files as [`RuleSet::compile_with`] does, taking them so that each descriptor is freed
    /// once compiled: a large configuration is not held twice, raw and compiled.
    pub fn compile_owned(files: Vec<ConfigFile>, metrics: &Metrics, mode: Domains) -> Result<RuleSet, ConfigError> {
        let digest = files.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, f| {
            (h ^ f.digest).wrapping_mul(0x0100_0000_01b3)
        });
        let count = files.len();
        let mut domains: HashMap<Box<str>, Domain> = HashMap::new();
        let mut origin: HashMap<String, PathBuf> = HashMap::new();
        // With merging: the file that defined each top-level descriptor ("domain.key_value").
        let mut tops: HashMap<String, PathBuf> = HashMap::new();
        let mut rules = 0;
        for file in files {
            let ConfigFile { path, domain: raw, .. } = file;
            if raw.domain.is_empty() {
                return Err(ConfigError::invalid(&path, "domain", "domain is empty"));
            }
            let first = origin.get(raw.domain.as_str()).cloned();
            if let (Some(first), Domains::OnePerFile) = (&first, mode) {
                return Err(ConfigError::invalid(
                    &path,
                    "domain",
                    format!(
                        "domain '{}' is also defined in '{}' (files of one domain merge only with --merge-domains)",
                        raw.domain,
                        first.display()
                    ),
                ));
            }
            origin.entry(raw.domain.clone()).or_insert_with(|| path.clone());
            let failure_policy = match raw.failure_policy.as_deref() {
                None => None,
                Some(p) => Some(FailurePolicy::from_name(p).ok_or_else(|| {
                    ConfigError::invalid(
                        &path,
                        "failure_policy",
                        format!("unknown failure policy '{p}' (expected fail_open, fail_closed or error)"),
                    )
                })?),
            };
            let mut compiler = Compiler {
                file: &path,
                domain: &raw.domain,
                rules: 0,
            };
            let domain = domains.entry(raw.domain.as_str().into()).or_insert_with(|| Domain {
                name: Arc::from(raw.domain.as_str()),
                failure_policy: None,
                root: Node::new(None, &raw.domain),
                buckets: Node::default(),
                stats: metrics.domain_stats(&raw.domain),
                override_stats: metrics.override_stats(&raw.domain),
                lists: Default::default(),
            });
            if let Some(policy) = failure_policy {
                if domain.failure_policy.is_some_and(|p| p != policy) {
                    return Err(ConfigError::invalid(
                        &path,
                        "failure_policy",
                        format!(
                            "domain '{}' has another failure policy in '{}'",
                            raw.domain,
                            first.as_ref().map_or_else(String::new, |f| f.display().to_string())
                        ),
                    ));
                }
                domain.failure_policy = Some(policy);
            }
            if mode == Domains::Merged {
                // A top-level descriptor another file of the domain defined; one file's own duplicates are
                // found by `level`, like any duplicate.
                for (i, d) in raw.descriptors.iter().enumerate() {
                    let label = format!("{}.{}", raw.domain, segment_of(d));
                    match tops.entry(label) {
                        MapEntry::Occupied(other) if *other.get() != path => {
                            return Err(ConfigError::invalid(
                                &path,
                                &format!("descriptors[{i}]"),
                                format!(
                                    "duplicate descriptor '{}': also defined in '{}'",
                                    other.key(),
                                    other.get().display()
                                ),
                            ));
                        }
                        MapEntry::Occupied(_) => {}
                        MapEntry::Vacant(slot) => {
                            slot.insert(path.clone());
                        }
                    }
                }
            }
            compiler.level(&mut domain.root, raw.descriptors, "descriptors", &raw.domain, false)?;
            compiler.buckets(&mut domain.buckets, &raw.quota_buckets)?;
            if !raw.lists.is_empty() {
                let mut keys = std::collections::HashSet::new();
                domain.root.keys(&mut keys);
                domain
                    .lists
                    .compile(&raw.lists, &keys, &raw.domain)
                    .map_err(|(at, message)| compiler.err(&at, message))?;
            }
            rules += compiler.rules;
        }
        Ok(RuleSet {
            domains,
            files: count,
            rules,
            digest,
        })
    }
}

/// A descriptor's name at its level: `key_value`, or `key` when it has no value.
fn segment_of(raw: &RawDescriptor) -> String {
    match raw.value.as_deref() {
        Some(v) if !v.is_empty() => format!("{}_{}", raw.key, v),
        _ => raw.key.to_string(),
    }
}

/// The items of a list in order, its memory freed as they are taken: a level's raw descriptors are not all kept
/// until the last is compiled.
struct Draining<T>(Vec<T>);

impl<T> Draining<T> {
    fn new(mut items: Vec<T>) -> Draining<T> {
        items.reverse();
        Draining(items)
    }
}

impl<T> Iterator for Draining<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        let item = self.0.pop()?;
        if self.0.len() < self.0.capacity() / 2 {
            self.0.shrink_to_fit();
        }
        Some(item)
    }
}

pub(super) struct Compiler<'a> {
    file: &'a Path,
    pub(super) domain: &'a str,
    pub(super) rules: usize,
}

impl Compiler<'_> {
    pub(super) fn err(&self, path: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.file, path, message)
    }

    fn level(
        &mut self,
        parent: &mut Node,
        descriptors: Vec<RawDescriptor>,
        path: &str,
        label: &str,
        dynamic: bool,
    ) -> Result<(), ConfigError> {
        // Each key's map of exact values is sized once: a level of many values is not rehashed as it grows.
        if descriptors.len() > 1 {
            let mut exact: HashMap<&str, usize> = HashMap::new();
            for d in &descriptors {
                if d.value.as_deref().is_some_and(|v| !v.is_empty() && !v.contains('*')) {
                    *exact.entry(&d.key).or_default() += 1;
                }
            }
            for (key, n) in exact {
                parent.branches_mut(key.into()).exact.reserve(n);
            }
        }
        for (i, mut raw) in Draining::new(descriptors).enumerate() {
            let here = format!("{path}[{i}]");
            if raw.key.is_empty() {
                return Err(self.err(&format!("{here}.key"), "descriptor key is empty"));
            }
            let wildcard = raw.value.as_deref().filter(|v| v.contains('*'));
            if raw.share_threshold && wildcard.is_none() {
                return Err(self.err(
                    &format!("{here}.share_threshold"),
                    "share_threshold needs a wildcard value (one containing '*')",
                ));
            }
            let dynamic = dynamic || raw.value_to_metric;
            let mut node = Node {
                value_to_metric: raw.value_to_metric,
                shared_value: wildcard.filter(|_| raw.share_threshold).map(Arc::from),
                ..Node::new(Some(label), &segment_of(&raw))
            };
            node.rule = self.rule(&raw, &here, &node.label, dynamic)?.map(|mut rule| {
                rule.metadata = raw.metadata.take().map(|m| Arc::new(*m));
                Box::new(rule)
            });
            self.rules += usize::from(node.rule.is_some());
            let child_path = format!("{here}.descriptors");
            let node_label = Arc::clone(&node.label);
            self.level(
                &mut node,
                std::mem::take(&mut raw.descriptors),
                &child_path,
                &node_label,
                dynamic,
            )?;

            let duplicate = || self.err(&here, format!("duplicate descriptor '{node_label}' at this level"));
            let branches = parent.branches_mut(std::mem::take(&mut raw.key));
            match raw.value.take().filter(|v| !v.is_empty()) {
                None => {
                    if branches.any.is_some() {
                        return Err(duplicate());
                    }
                    branches.any = Some(Box::new(node));
                }
                Some(v) if v.contains('*') => {
                    if branches.wildcards.iter().any(|(_, n)| n.segment() == node.segment()) {
                        return Err(duplicate());
                    }
                    branches.wildcards.push((Pattern::new(&v), node));
                }
                Some(v) => match branches.exact.entry(v) {
                    MapEntry::Occupied(_) => return Err(duplicate()),
                    MapEntry::Vacant(slot) => {
                        slot.insert(node);
                    }
                },
            }
        }
        Ok(())
    }

    pub(super) fn rule(
        &self,
        raw: &RawDescriptor,
        here: &str,
        label: &Arc<str>,
        dynamic: bool,
    ) -> Result<Option<Rule>, ConfigError> {
        let (raws, base): (Vec<&RawRateLimit>, String) = match (&raw.rate_limit, &raw.rate_limits) {
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
        };
        let several = raw.rate_limits.is_some();
        let mut tiers = Vec::with_capacity(raws.len());
        let mut replaces = Vec::new();
        let mut record = None;
        let mut unlimited = false;
        for (i, rl) in raws.iter().enumerate() {
            let at = if several { format!("{base}[{i}]") } else { base.clone() };
            let tier = self.tier(rl, &at)?;
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
            if let Some(r) = &rl.record {
                if record.is_some() {
                    return Err(self.err(&format!("{at}.record"), "only one limit of a rule may keep records"));
                }
                if r.key.is_empty() {
                    return Err(self.err(&format!("{at}.record.key"), "the entry key to record is empty"));
                }
                if r.size == 0 || r.size > MAX_RECORDS {
                    return Err(self.err(
                        &format!("{at}.record.size"),
                        format!("must be between 1 and {MAX_RECORDS}"),
                    ));
                }
                record = Some(Record {
                    key: Arc::from(r.key.as_str()),
                    size: r.size,
                });
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

    /// One limit; `None` for `unlimited: true`.
    fn tier(&self, rl: &RawRateLimit, base: &str) -> Result<Option<Tier>, ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        let name = rl.name.as_deref().filter(|n| !n.is_empty()).map(Arc::from);
        if rl.unlimited {
            if let Some(unit) = &rl.unit {
                if Unit::from_name(unit).is_none() {
                    return Err(self.err(&at("unit"), format!("unknown unit '{unit}'")));
                }
                return Err(self.err(&at("unit"), "a rule cannot be unlimited and have a unit"));
            }
            for (field, set) in [
                ("algorithm", rl.algorithm.is_some()),
                ("unit_multiplier", rl.unit_multiplier.is_some()),
                ("burst", rl.burst.is_some()),
                ("record", rl.record.is_some()),
                ("cost", rl.cost.is_some()),
                ("price", rl.price.is_some()),
                ("global", rl.global),
            ] {
                if set {
                    return Err(self.err(&at(field), "does not apply to an unlimited rule"));
                }
            }
            return Ok(None);
        }
        let unit = match rl.unit.as_deref() {
            None => return Err(self.err(&at("unit"), "unit is missing (or set unlimited: true)")),
            Some(u) => Unit::from_name(u).ok_or_else(|| {
                self.err(
                    &at("unit"),
                    format!("unknown unit '{u}' (expected second, minute, hour, day, week, month or year)"),
                )
            })?,
        };
        let algorithm = match rl.algorithm.as_deref() {
            None => Algorithm::FixedWindow,
            Some(a) => Algorithm::from_name(a).ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                self.err(
                    &at("algorithm"),
                    format!("unknown algorithm '{a}' (expected {})", names.join(", ")),
                )
            })?,
        };
        let multiplier = rl.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            return Err(self.err(&at("unit_multiplier"), "must be at least 1"));
        }
        let window_s = unit.seconds() * u64::from(multiplier);
        if window_s > MAX_WINDOW_SECONDS {
            return Err(self.err(
                &at("unit_multiplier"),
                format!("a window of {multiplier} {}s is longer than 100 years", unit.name()),
            ));
        }
        let requests = rl.requests_per_unit;
        let burst = match (algorithm, rl.burst) {
            (Algorithm::TokenBucket, None) => requests,
            (Algorithm::LeakyBucket, None) => 1,
            (a, Some(_)) if !a.is_bucket() => {
                return Err(self.err(
                    &at("burst"),
                    format!("burst applies to token_bucket and leaky_bucket, not {}", a.name()),
                ));
            }
            (_, Some(b)) => b,
            (_, None) => requests,
        };
        if algorithm.is_bucket() {
            if requests == 0 {
                return Err(self.err(
                    &at("requests_per_unit"),
                    format!("must be at least 1 for {} (the refill rate)", algorithm.name()),
                ));
            }
            if burst == 0 {
                return Err(self.err(&at("burst"), "must be at least 1"));
            }
            let interval = (window_s * 1_000_000).div_ceil(u64::from(requests));
            if u64::from(burst) * interval > MAX_WINDOW_SECONDS * 1_000_000 {
                return Err(self.err(&at("burst"), "the bucket takes longer than 100 years to fill"));
            }
        }
        if algorithm == Algorithm::SlidingLog && requests > MAX_LOG_LIMIT {
            return Err(self.err(
                &at("requests_per_unit"),
                format!(
                    "{requests} is too many for sliding_log (at most {MAX_LOG_LIMIT}: it stores every hit); \
                     use sliding_window"
                ),
            ));
        }
        if rl.global && !matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow) {
            return Err(self.err(
                &at("global"),
                format!(
                    "{} cannot be counted across regions (global limits are fixed_window or sliding_window: a \
                     region adds the others' counts, and a {} is state no count can merge)",
                    algorithm.name(),
                    if algorithm.is_bucket() {
                        "bucket's arrival time"
                    } else {
                        "set of hits or leases"
                    }
                ),
            ));
        }
        Ok(Some(Tier {
            limit: Limit {
                requests,
                unit,
                multiplier,
                algorithm,
                burst,
            },
            name,
            cost: self.tier_cost(rl, base)?,
            global: rl.global,
        }))
    }

    /// What a hit costs a limit: `cost: <name>`, `price: {<name>: <price>, ...}`, or the request's cost.
    fn tier_cost(&self, rl: &RawRateLimit, base: &str) -> Result<TierCost, ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        match (&rl.cost, &rl.price) {
            (Some(_), Some(_)) => Err(self.err(&at("price"), "use either cost or price, not both")),
            (Some(name), None) if name.is_empty() => Err(self.err(&at("cost"), "the cost name is empty")),
            (Some(name), None) => Ok(TierCost::Named(Arc::from(&**name))),
            (None, Some(prices)) if prices.is_empty() => Err(self.err(&at("price"), "no named costs to price")),
            (None, Some(prices)) => {
                if let Some(name) = prices.keys().find(|n| n.is_empty()) {
                    return Err(self.err(&at(&format!("price.{name}")), "the cost name is empty"));
                }
                Ok(TierCost::Priced(
                    prices
                        .iter()
                        .map(|(name, price)| (Arc::from(name.as_str()), *price))
                        .collect(),
                ))
            }
            (None, None) => Ok(TierCost::Request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    fn compile(texts: &[(&str, &str)]) -> Result<RuleSet, ConfigError> {
        let files: Result<Vec<_>, _> = texts.iter().map(|(n, t)| parse(Path::new(n), t)).collect();
        RuleSet::compile(&files?, &Metrics::discarded(0.8))
    }

    fn err(text: &str) -> String {
        compile(&[("d.yaml", text)]).unwrap_err().to_string()
    }

    #[test]
    fn load_errors_name_file_and_path() {
        let cases = [
            ("descriptors: []\n", "'d.yaml': domain: domain is empty"),
            (
                "domain: d\ndescriptors: [{key: ''}]\n",
                "descriptors[0].key: descriptor key is empty",
            ),
            (
                "domain: d\ndescriptors: [{key: a, value: b}, {key: a, value: b}]\n",
                "descriptors[1]: duplicate descriptor 'd.a_b'",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n",
                "descriptors[0].rate_limit.unit: unknown unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unlimited: true, unit: second}}]\n",
                "descriptors[0].rate_limit.unit: a rule cannot be unlimited and have a unit",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unlimited: true, unit: bogus}}]\n",
                "descriptors[0].rate_limit.unit: unknown unit 'bogus'",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}}]\n",
                "descriptors[0].rate_limit.replaces[0].name: replaces entry is empty",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: x}]}}]\n",
                "replaces[0].name: a rule cannot replace itself",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}}]\n",
                "descriptors[0].rate_limit.algorithm: unknown algorithm 'magic'",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}}]\n",
                "descriptors[0].rate_limit.unit_multiplier: must be at least 1",
            ),
            (
                "domain: d\ndescriptors: [{key: a, rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 1000}}]\n",
                "longer than 100 years",
            ),
            (
                "domain: d\ndescriptors: [{key: a, value: b, share_threshold: true}]\n",
                "descriptors[0].share_threshold",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(e.starts_with("config 'd.yaml': "), "{e}");
        }
    }

    #[test]
    fn same_domain_in_two_files() {
        let e = compile(&[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'b.yaml'") && e.contains("also defined in 'a.yaml'"), "{e}");
    }
}
