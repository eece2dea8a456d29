//! The compiled, immutable rule set: what the decision core matches request descriptors against.
//!
//! [`RuleSet::compile`] turns the raw files of [`crate::config`] into a tree per domain and rejects everything the
//! reference rejects at load time, naming file and path. The result cannot be invalid, so the hot path neither
//! re-validates nor allocates to match: one hash lookup per entry for exact values, a short scan of the wildcard
//! patterns of that key, then the key-only branch. There is no backtracking.
//!
//! One question per file; a file uses only the ones listed before it and [`RuleSet`] here:
//!
//! - `rules/vocabulary.rs`: what a rule can say: [`Unit`], [`Algorithm`], [`Limit`], [`Tier`], [`Record`],
//!   [`FailurePolicy`], [`Metadata`], and the bounds the compiler enforces ([`MAX_LOG_LIMIT`], [`MAX_RECORDS`]).
//! - `rules/pattern.rs`: a value with `*` wildcards, as rules and lists hold it.
//! - `rules/lists.rs`: a domain's deny and allow `lists` of descriptor values (exact, wildcards, CIDR ranges).
//! - `rules/tree.rs`: the compiled [`Rule`] and the match tree of a [`Domain`]; how a descriptor finds its rule.
//! - `rules/compile.rs`: [`RuleSet::compile`], from raw files to trees, with every load-time error.
//! - `rules/buckets.rs`: the RLQS `quota_buckets` of a domain, compiled into a tree of their own.
//! - `rules/summary.rs`: the text of [`RuleSet::summary`] for `sluice check` and logs.
//!
//! This file owns [`RuleSet`] itself, and [`Domains`] (how files of one domain combine), and re-exports every
//! public item, so `sluice_core::rules::X` stays the one path to name it.

mod buckets;
mod compile;
mod lists;
mod pattern;
mod summary;
mod tree;
mod vocabulary;

use std::collections::HashMap;

pub use lists::{DEFAULT_REFRESH, List, ListAction, ListSource, Lists, LiveList, LiveLists, Matcher, check_value};
pub use tree::{Domain, Match, Rule};
pub use vocabulary::{
    Algorithm, BucketSettings, FailurePolicy, InitialAssignment, Limit, MAX_BUCKETS, MAX_LOG_LIMIT, MAX_RECORDS,
    Metadata, Record, Tier, TierCost, Unit,
};

/// Every domain's rules, compiled. Immutable; a reload builds a new one.
#[derive(Debug)]
pub struct RuleSet {
    domains: HashMap<Box<str>, Domain>,
    files: usize,
    rules: usize,
    digest: u64,
}

impl RuleSet {
    /// The compiled rules of the domain `name`, if a file defines it.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, in no order.
    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// The longest window of any limit (0 with none).
    pub fn longest_window_us(&self) -> u64 {
        let mut longest = 0;
        for domain in self.domains() {
            domain.each_rule(&mut |rule| {
                for tier in &rule.tiers {
                    longest = longest.max(tier.limit.window_us());
                }
            });
        }
        longest
    }

    /// A hash of every file's name and text: equal digests, equal configurations.
    pub fn digest(&self) -> u64 {
        self.digest
    }
}

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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{ConfigError, parse};
    use crate::metrics::Metrics;

    fn compile(texts: &[(&str, &str)]) -> Result<RuleSet, ConfigError> {
        let files: Result<Vec<_>, _> = texts.iter().map(|(n, t)| parse(Path::new(n), t)).collect();
        RuleSet::compile(&files?, &Metrics::discarded(0.8))
    }

    #[test]
    fn matching_order_and_depth() {
        let rules = compile(&[(
            "d.yaml",
            "domain: d
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 1, name: exact}
  - key: k
    value: ex*
    rate_limit: {unit: second, requests_per_unit: 2, name: wild1}
  - key: k
    value: e*
    rate_limit: {unit: second, requests_per_unit: 3, name: wild2}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4, name: any}
  - key: n
    value: v
    descriptors:
      - key: m
        rate_limit: {unit: minute, requests_per_unit: 5, name: nested}
  - key: n
    rate_limit: {unit: second, requests_per_unit: 6, name: n-any}
    descriptors:
      - key: o
        rate_limit: {unit: minute, requests_per_unit: 7, name: n-o}
",
        )])
        .unwrap();
        let d = rules.domain("d").unwrap();
        let name = |entries: &[(&str, &str)]| d.find(entries).and_then(|m| m.rule.name.as_deref().map(str::to_string));
        assert_eq!(name(&[("k", "exact")]).as_deref(), Some("exact"));
        assert_eq!(name(&[("k", "extra")]).as_deref(), Some("wild1"));
        assert_eq!(name(&[("k", "eel")]).as_deref(), Some("wild2"));
        assert_eq!(name(&[("k", "zzz")]).as_deref(), Some("any"));
        assert_eq!(name(&[("n", "v"), ("m", "1")]).as_deref(), Some("nested"));
        // n=v has no rule of its own.
        assert_eq!(name(&[("n", "v")]), None);
        // no backtracking: n=v dead-ends at o, the key-only branch n is not retried.
        assert_eq!(name(&[("n", "v"), ("o", "1")]), None);
        assert_eq!(name(&[("n", "w"), ("o", "1")]).as_deref(), Some("n-o"));
        // deeper than the tree.
        assert_eq!(name(&[("k", "exact"), ("x", "y")]), None);
        assert_eq!(name(&[("unknown", "x")]), None);
    }

    #[test]
    fn labels_and_shared_patterns() {
        let rules = compile(&[(
            "d.yaml",
            "domain: d
descriptors:
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
",
        )])
        .unwrap();
        let d = rules.domain("d").unwrap();
        let m = d.find(&[("path", "/api/x")]).unwrap();
        assert_eq!(&*m.rule.path, "d.path_/api/*");
        assert_eq!(m.shared, vec![(0, "/api/*")]);
        assert!(!m.rule.dynamic_label);
        let m = d.find(&[("user", "42")]).unwrap();
        assert!(m.rule.dynamic_label);
        assert_eq!(d.detailed_label(&[("user", "42")]), "d.user_42");
    }
}
