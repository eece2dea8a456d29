//! The RLQS `quota_buckets` of a domain: which bucket ids a rule applies to, compiled into a match tree of their own.
//!
//! A bucket id is a map of strings, so its entries have no order: the compiler lays each rule's entries out in key
//! order, one level per key, and the limiter sorts a bucket id's entries the same way before matching. From there it
//! is the descriptors' matching (exact value, then wildcards in config order, then the key alone; no backtracking),
//! so a bucket id matches a rule when it has exactly the rule's keys.

use std::collections::hash_map::Entry as MapEntry;
use std::sync::Arc;

use crate::config::{ConfigError, RawDescriptor, RawQuotaBucket};

use super::compile::Compiler;
use super::pattern::Pattern;
use super::tree::{Node, Rule};
use super::vocabulary::{Algorithm, BucketSettings, InitialAssignment};

/// The longest assignment TTL a rule may ask for: a day.
const MAX_TTL_S: u32 = 86_400;

impl Compiler<'_> {
    /// Compiles every quota bucket rule into the tree under `root`.
    pub(super) fn buckets(&mut self, root: &mut Node, raws: &[RawQuotaBucket]) -> Result<(), ConfigError> {
        for (i, raw) in raws.iter().enumerate() {
            let here = format!("quota_buckets[{i}]");
            let at = |field: &str| format!("{here}.{field}");
            if raw.bucket.is_empty() {
                return Err(self.err(&at("bucket"), "the bucket id has no entries"));
            }
            if raw.bucket.keys().any(String::is_empty) {
                return Err(self.err(&at("bucket"), "a bucket key is empty"));
            }
            let wildcard = |v: &Option<String>| v.as_deref().is_some_and(|v| v.contains('*'));
            if raw.share_threshold && !raw.bucket.values().any(wildcard) {
                return Err(self.err(
                    &at("share_threshold"),
                    "share_threshold needs a wildcard value (one containing '*')",
                ));
            }
            let settings = self.bucket_settings(raw, &here)?;
            let label = std::iter::once(format!("{}.bucket", self.domain))
                .chain(raw.bucket.iter().map(|(k, v)| match v.as_deref() {
                    Some(v) if !v.is_empty() => format!("{k}_{v}"),
                    _ => k.clone(),
                }))
                .collect::<Vec<_>>()
                .join(".");
            let mut rule = self.bucket_rule(raw, &here, &label)?;
            rule.bucket = Some(Box::new(settings));
            let node = self.bucket_node(root, raw, &here)?;
            if node.rule.is_some() {
                return Err(self.err(
                    &at("bucket"),
                    format!("duplicate quota bucket '{label}': an earlier one has the same entries"),
                ));
            }
            node.rule = Some(Box::new(rule));
            self.rules += 1;
        }
        Ok(())
    }

    /// The rule of the quota bucket `raw` at `here` (metric label `label`): its limits, each of an algorithm that
    /// can share a quota among Envoys, keeping no records.
    fn bucket_rule(&self, raw: &RawQuotaBucket, here: &str, label: &str) -> Result<Rule, ConfigError> {
        let limits = RawDescriptor {
            key: Box::default(),
            value: None,
            rate_limit: raw.rate_limit.clone().map(Box::new),
            rate_limits: raw.rate_limits.clone(),
            descriptors: Vec::new(),
            shadow_mode: raw.shadow_mode,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: false,
            quota_mode: false,
            cost_reports: false,
            metadata: None,
        };
        let Some(rule) = self.rule(&limits, here, &Arc::from(label), false)? else {
            return Err(self.err(here, "a quota bucket needs rate_limit or rate_limits"));
        };
        if rule.record.is_some() {
            return Err(self.err(here, "a quota bucket cannot keep records"));
        }
        for (j, tier) in rule.tiers.iter().enumerate() {
            if !tier.limit.algorithm.counts() {
                let limit = if raw.rate_limits.is_some() {
                    format!("rate_limits[{j}]")
                } else {
                    "rate_limit".to_string()
                };
                return Err(self.err(
                    &format!("{here}.{limit}.algorithm"),
                    format!(
                        "'{}' cannot share a quota among Envoys (use {})",
                        tier.limit.algorithm.name(),
                        Algorithm::ALL
                            .iter()
                            .filter(|a| a.counts())
                            .map(|a| a.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        Ok(rule)
    }

    /// The node of the quota bucket `raw` at `here`, one level per entry in key order under `root`, made where it
    /// is missing. A wildcard level is shared (`share_threshold`) in every bucket or in none.
    fn bucket_node<'n>(
        &self,
        root: &'n mut Node,
        raw: &RawQuotaBucket,
        here: &str,
    ) -> Result<&'n mut Node, ConfigError> {
        let mut node = root;
        for (key, value) in &raw.bucket {
            let branches = node.branches_mut(key.as_str().into());
            let fresh = |segment: String, shared: Option<&str>| Node {
                shared_value: shared.map(Arc::from),
                ..Node::new(None, &segment)
            };
            node = match value.as_deref() {
                None | Some("") => branches.any.get_or_insert_with(|| Box::new(fresh(key.clone(), None))),
                Some(v) if v.contains('*') => {
                    let shared = raw.share_threshold.then_some(v);
                    let segment = format!("{key}_{v}");
                    match branches.wildcards.iter().position(|(_, n)| n.segment() == segment) {
                        Some(p) if branches.wildcards[p].1.shared_value.as_deref() != shared => {
                            return Err(self.err(
                                &format!("{here}.share_threshold"),
                                format!("'{key}: {v}' is shared in one quota bucket and not in another"),
                            ));
                        }
                        Some(p) => &mut branches.wildcards[p].1,
                        None => {
                            branches.wildcards.push((Pattern::new(v), fresh(segment, shared)));
                            &mut branches.wildcards.last_mut().expect("just pushed").1
                        }
                    }
                }
                Some(v) => match branches.exact.entry(v.into()) {
                    MapEntry::Occupied(slot) => slot.into_mut(),
                    MapEntry::Vacant(slot) => slot.insert(fresh(format!("{key}_{v}"), None)),
                },
            };
        }
        Ok(node)
    }

    fn bucket_settings(&self, raw: &RawQuotaBucket, here: &str) -> Result<BucketSettings, ConfigError> {
        let at = |field: &str| format!("{here}.{field}");
        let ttl = raw.assignment_ttl_seconds.unwrap_or(BucketSettings::DEFAULT_TTL_S);
        if !(1..=MAX_TTL_S).contains(&ttl) {
            return Err(self.err(
                &at("assignment_ttl_seconds"),
                format!("must be between 1 and {MAX_TTL_S}"),
            ));
        }
        let abandon = raw
            .abandon_after_seconds
            .unwrap_or(BucketSettings::DEFAULT_ABANDON_AFTER_S.max(ttl));
        if abandon < ttl {
            return Err(self.err(
                &at("abandon_after_seconds"),
                format!("must be at least assignment_ttl_seconds ({ttl})"),
            ));
        }
        let initial = match raw.initial_assignment.as_deref() {
            None => InitialAssignment::Share,
            Some(name) => InitialAssignment::from_name(name).ok_or_else(|| {
                self.err(
                    &at("initial_assignment"),
                    format!("unknown initial assignment '{name}' (expected share, allow_all or deny_all)"),
                )
            })?,
        };
        Ok(BucketSettings {
            assignment_ttl_s: ttl,
            abandon_after_s: abandon,
            initial,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::parse;
    use crate::metrics::Metrics;
    use crate::rules::{Algorithm, InitialAssignment, RuleSet};

    fn compile(text: &str) -> Result<RuleSet, String> {
        let file = parse(Path::new("q.yaml"), text).map_err(|e| e.to_string())?;
        RuleSet::compile(&[file], &Metrics::discarded(0.8)).map_err(|e| e.to_string())
    }

    const RULES: &str = "domain: q
quota_buckets:
  - bucket: {name: per_user, user: }
    rate_limit: {unit: minute, requests_per_unit: 10}
  - bucket: {user: vip, name: per_user}
    rate_limit: {unit: minute, requests_per_unit: 100, name: vip}
    assignment_ttl_seconds: 5
    initial_assignment: allow_all
  - bucket: {name: per_team, team: 'eng-*'}
    share_threshold: true
    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
      - {unit: hour, requests_per_unit: 1000, algorithm: sliding_window}
";

    #[test]
    fn bucket_ids_match_whatever_the_order_of_their_entries() {
        let rules = compile(RULES).unwrap();
        let d = rules.domain("q").unwrap();
        let find = |mut entries: Vec<(&str, &str)>| {
            entries.sort();
            d.find_bucket(&entries)
                .map(|m| (m.rule.path.to_string(), m.shared.len()))
        };
        assert_eq!(
            find(vec![("user", "ann"), ("name", "per_user")]),
            Some(("q.bucket.name_per_user.user".into(), 0))
        );
        assert_eq!(
            find(vec![("name", "per_user"), ("user", "vip")]),
            Some(("q.bucket.name_per_user.user_vip".into(), 0))
        );
        assert_eq!(
            find(vec![("team", "eng-db"), ("name", "per_team")]),
            Some(("q.bucket.name_per_team.team_eng-*".into(), 1))
        );
        // Exactly the rule's keys: one more or one fewer is no match.
        assert_eq!(find(vec![("name", "per_user")]), None);
        assert_eq!(find(vec![("name", "per_user"), ("user", "a"), ("zone", "z")]), None);
        assert_eq!(find(vec![("team", "ops"), ("name", "per_team")]), None);
        // Descriptors do not see buckets, and buckets do not see descriptors.
        assert!(d.find(&[("name", "per_user"), ("user", "ann")]).is_none());
        let vip = d.find_bucket(&[("name", "per_user"), ("user", "vip")]).unwrap().rule;
        let settings = *vip.bucket.as_deref().unwrap();
        assert_eq!(
            (settings.assignment_ttl_s, settings.initial),
            (5, InitialAssignment::AllowAll)
        );
        assert!(
            rules.summary().contains("q.bucket.name_per_team.team_eng-*: "),
            "{}",
            rules.summary()
        );
    }

    #[test]
    fn bad_buckets_are_named_by_file_and_path() {
        let cases = [
            (
                "  - bucket: {}\n    rate_limit: {unit: second, requests_per_unit: 1}",
                "quota_buckets[0].bucket: the bucket id has no entries",
            ),
            (
                "  - bucket: {'': x}\n    rate_limit: {unit: second, requests_per_unit: 1}",
                "quota_buckets[0].bucket: a bucket key is empty",
            ),
            (
                "  - bucket: {a: x}",
                "quota_buckets[0]: a quota bucket needs rate_limit or rate_limits",
            ),
            (
                "  - bucket: {a: x}\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: concurrency}",
                "quota_buckets[0].rate_limit.algorithm: 'concurrency' cannot share a quota",
            ),
            (
                "  - bucket: {a: x}\n    rate_limits: [{unit: second, requests_per_unit: 1}, {unit: minute, requests_per_unit: 9, algorithm: sliding_log}]",
                "quota_buckets[0].rate_limits[1].algorithm: 'sliding_log'",
            ),
            (
                "  - bucket: {a: x}\n    rate_limit: {unit: second, requests_per_unit: 1}\n    assignment_ttl_seconds: 0",
                "quota_buckets[0].assignment_ttl_seconds: must be between 1 and 86400",
            ),
            (
                "  - bucket: {a: x}\n    rate_limit: {unit: second, requests_per_unit: 1}\n    assignment_ttl_seconds: 30\n    abandon_after_seconds: 10",
                "quota_buckets[0].abandon_after_seconds: must be at least assignment_ttl_seconds (30)",
            ),
            (
                "  - bucket: {a: x}\n    rate_limit: {unit: second, requests_per_unit: 1}\n    initial_assignment: maybe",
                "quota_buckets[0].initial_assignment: unknown initial assignment 'maybe'",
            ),
            (
                "  - bucket: {a: x}\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}",
                "quota_buckets[0].share_threshold: share_threshold needs a wildcard value",
            ),
            (
                "  - bucket: {a: x, b: }\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - bucket: {b: , a: x}\n    rate_limit: {unit: minute, requests_per_unit: 1}",
                "quota_buckets[1].bucket: duplicate quota bucket 'q.bucket.a_x.b'",
            ),
            (
                "  - bucket: {a: [x]}\n    rate_limit: {unit: second, requests_per_unit: 1}",
                "quota_buckets[0].bucket.a: invalid type",
            ),
            (
                "  - bucket: {a: x}\n    colour: red",
                "quota_buckets[0]: unknown field `colour`",
            ),
            (
                "  - bucket: {a: x}\n    rate_limit: {unit: fortnight, requests_per_unit: 1}",
                "quota_buckets[0].rate_limit.unit: unknown unit 'fortnight'",
            ),
        ];
        for (body, expected) in cases {
            let e = compile(&format!("domain: q\nquota_buckets:\n{body}\n")).unwrap_err();
            assert!(e.starts_with("config 'q.yaml': "), "{e}");
            assert!(e.contains(expected), "expected '{expected}' in: {e}");
        }
    }

    /// A quota bucket takes every counting algorithm (the algorithm's own answer, `Algorithm::counts`), and the
    /// error for another names them all.
    #[test]
    fn quota_buckets_take_every_counting_algorithm() {
        let bucket = |algorithm: &str| {
            format!(
                "domain: q\nquota_buckets:\n  - bucket: {{a: x}}\n    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: {algorithm}}}\n"
            )
        };
        for algorithm in Algorithm::ALL {
            let compiled = compile(&bucket(algorithm.name()));
            assert_eq!(compiled.is_ok(), algorithm.counts(), "{algorithm:?}: {compiled:?}");
        }
        let e = compile(&bucket("queue")).unwrap_err();
        assert!(
            e.contains("(use fixed_window, sliding_window, token_bucket, leaky_bucket)"),
            "{e}"
        );
    }
}
