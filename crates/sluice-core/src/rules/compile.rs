//! The compiler: [`RuleSet::compile`] turns the shape-checked files of [`crate::config`] into one match tree per
//! domain, and a rule's YAML `metadata` into plain data.
//!
//! It rejects everything the reference rejects at load time, each error naming the file and the path of the offending
//! key (`config 'edge.yaml': descriptors[2].rate_limit.unit: unknown unit 'fortnight'`). What it returns cannot be
//! invalid, so the limiter never validates again.
//!
//! This file compiles the domains and their trees; a node's rule is compiled in `compile/rule.rs`, and each of its
//! limits in `compile/tier.rs`.

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{ConfigError, ConfigFile, RawDescriptor, RawDomain};
use crate::metrics::Metrics;

use super::pattern::Pattern;
use super::tree::{Domain, Node};
use super::vocabulary::FailurePolicy;
use super::{Domains, RuleSet};

mod rule;
#[cfg(test)]
mod tests;
mod tier;

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
            let first = claim_domain(&mut origin, &raw, &path, mode)?;
            let failure_policy = failure_policy_of(&raw, &path)?;
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
                claim_tops(&mut tops, &raw, &path)?;
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

/// Notes the file `path` as the one that defines `raw`'s domain, unless another file did first: that file is
/// returned, and it is an error unless files of one domain merge.
fn claim_domain(
    origin: &mut HashMap<String, PathBuf>,
    raw: &RawDomain,
    path: &Path,
    mode: Domains,
) -> Result<Option<PathBuf>, ConfigError> {
    if raw.domain.is_empty() {
        return Err(ConfigError::invalid(path, "domain", "domain is empty"));
    }
    let first = origin.get(raw.domain.as_str()).cloned();
    if let (Some(first), Domains::OnePerFile) = (&first, mode) {
        return Err(ConfigError::invalid(
            path,
            "domain",
            format!(
                "domain '{}' is also defined in '{}' (files of one domain merge only with --merge-domains)",
                raw.domain,
                first.display()
            ),
        ));
    }
    origin.entry(raw.domain.clone()).or_insert_with(|| path.to_path_buf());
    Ok(first)
}

/// A file's `failure_policy` for its domain, if it sets one.
fn failure_policy_of(raw: &RawDomain, path: &Path) -> Result<Option<FailurePolicy>, ConfigError> {
    match raw.failure_policy.as_deref() {
        None => Ok(None),
        Some(p) => Some(FailurePolicy::from_name(p).ok_or_else(|| {
            ConfigError::invalid(
                path,
                "failure_policy",
                format!("unknown failure policy '{p}' (expected fail_open, fail_closed or error)"),
            )
        }))
        .transpose(),
    }
}

/// With merging, notes the file `path` as the one that defines each of its top-level descriptors: one that another
/// file of the domain defines is an error (one file's own duplicates are found by `level`, like any duplicate).
fn claim_tops(tops: &mut HashMap<String, PathBuf>, raw: &RawDomain, path: &Path) -> Result<(), ConfigError> {
    for (i, d) in raw.descriptors.iter().enumerate() {
        let label = format!("{}.{}", raw.domain, segment_of(d));
        match tops.entry(label) {
            MapEntry::Occupied(other) if *other.get() != path => {
                return Err(ConfigError::invalid(
                    path,
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
                slot.insert(path.to_path_buf());
            }
        }
    }
    Ok(())
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
}
