//! The compiled match tree of a domain: [`Rule`]s on nodes, one level per descriptor entry, and [`Domain::find`].
//!
//! A level holds, per key, the exact values in a hash map, the wildcard patterns in config order and the key-only
//! branch, tried in that order. The tree is built once by the compiler and never changes, so matching neither
//! re-validates nor allocates (beyond the list of shared levels), and never backtracks.

use std::collections::HashMap;
use std::sync::Arc;

use crate::metrics::{DomainStats, Metrics, RuleStats};

use super::lists::Lists;
use super::pattern::Pattern;
use super::vocabulary::{BucketSettings, FailurePolicy, Metadata, Record, Tier};

/// The `rate_limit` (or `rate_limits`) of one node of the tree.
#[derive(Debug)]
pub struct Rule {
    /// The limits, all decided together; empty for `unlimited: true`.
    pub tiers: Box<[Tier]>,
    /// The rule's name (its first named limit), reported and matched by `replaces`.
    pub name: Option<Arc<str>>,
    pub replaces: Box<[Arc<str>]>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// Hits with a cost report usage that already happened (counted whatever the limits say); a hit of cost 0
    /// checks that something is left.
    pub cost_reports: bool,
    pub record: Option<Record>,
    /// The rule's own metric label, e.g. `edge.path_/login.user` (no request values).
    pub path: Arc<str>,
    /// The metric label must be built from the request (`detailed_metric` or `value_to_metric` on the way).
    pub dynamic_label: bool,
    pub detailed_metric: bool,
    pub metadata: Option<Arc<Metadata>>,
    /// The rule's hit counters, registered on its first hit: a configuration of many rules exposes series only
    /// for the rules that were hit (see [`Rule::stats`]).
    pub(super) stats: std::sync::OnceLock<Box<RuleStats>>,
    /// For a rule of RLQS `quota_buckets`: how its assignments are handed out.
    pub bucket: Option<Box<BucketSettings>>,
}

impl Rule {
    /// The rule's hit counters in `metrics`, under its own label in `domain`; registered on the first call. A rule
    /// that a reload keeps gets the same series back (the recorder keys them by name and labels).
    pub fn stats(&self, metrics: &Metrics, domain: &str) -> &RuleStats {
        self.stats
            .get_or_init(|| Box::new(metrics.rule_stats(domain, &self.path)))
    }
    /// Whether any of the rule's names is in `replaced`.
    pub fn is_replaced(&self, replaced: &std::collections::HashSet<&str>) -> bool {
        self.name
            .iter()
            .chain(self.tiers.iter().filter_map(|t| t.name.as_ref()))
            .any(|n| replaced.contains(&**n))
    }
}

impl Node {
    /// Every descriptor key of the levels below this node.
    pub(super) fn keys(&self, out: &mut std::collections::HashSet<String>) {
        for (key, branches) in self.children.iter().flat_map(|c| c.iter()) {
            out.insert(key.to_string());
            let nodes = branches.exact.values().chain(branches.wildcards.iter().map(|(_, n)| n));
            for node in nodes.chain(branches.any.as_deref()) {
                node.keys(out);
            }
        }
    }
}

/// A node of a domain's tree: an optional rule and the next level.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub(super) rule: Option<Box<Rule>>,
    /// The node's metric path, e.g. `edge.path_/login.user`, shared with its rule's [`Rule::path`].
    pub(super) label: Arc<str>,
    /// Where this level's part of `label` starts: its `key` or `key_value`.
    pub(super) segment_at: u32,
    pub(super) value_to_metric: bool,
    /// For a wildcard node with `share_threshold`: every matching value shares the counter named by the pattern.
    pub(super) shared_value: Option<Arc<str>>,
    /// The next level by key; none on a leaf, which most nodes of a large level are. Boxed: a node sits inline in
    /// its parent's map of exact values, where an empty map would cost 48 bytes per value.
    #[allow(clippy::box_collection)]
    pub(super) children: Option<Box<HashMap<Box<str>, Branches>>>,
}

/// The nodes of one level that share a key.
#[derive(Debug, Default)]
pub(super) struct Branches {
    pub(super) exact: HashMap<Box<str>, Node>,
    pub(super) wildcards: Vec<(Pattern, Node)>,
    pub(super) any: Option<Box<Node>>,
}

/// The rules of one domain.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    /// The domain's own failure policy (`failure_policy` in its file), if any.
    pub failure_policy: Option<FailurePolicy>,
    pub(super) root: Node,
    /// The RLQS `quota_buckets`, one level per bucket key in key order.
    pub(super) buckets: Node,
    pub stats: DomainStats,
    /// The hit counters of every descriptor that carries its own limit (`RateLimitOverride`): one label per domain
    /// whatever the descriptor's entries, so clients cannot create series.
    pub override_stats: RuleStats,
    /// The deny and allow `lists`, checked before the limits.
    pub lists: Lists,
}

/// What a request descriptor matched.
#[derive(Debug)]
pub struct Match<'a> {
    pub rule: &'a Rule,
    /// Levels whose counter identity is the `share_threshold` pattern instead of the request's value.
    pub shared: Vec<(usize, &'a str)>,
}

impl Domain {
    /// Finds the rule for a descriptor's entries, one entry per level: exact value, then wildcards in config order,
    /// then the key alone. The rule is the one on the node the last entry lands on; no backtracking.
    pub fn find<'a, K: AsRef<str>, V: AsRef<str>>(&'a self, entries: &[(K, V)]) -> Option<Match<'a>> {
        self.root.find_path(entries)
    }

    /// Finds the rule of an RLQS bucket id, given its entries sorted by key, as [`Domain::find`] does for a
    /// descriptor.
    pub fn find_bucket<'a, K: AsRef<str>, V: AsRef<str>>(&'a self, sorted: &[(K, V)]) -> Option<Match<'a>> {
        self.buckets.find_path(sorted)
    }

    /// The metric label of a match that includes request values (`detailed_metric`, `value_to_metric`).
    pub fn detailed_label<K: AsRef<str>, V: AsRef<str>>(&self, entries: &[(K, V)]) -> String {
        let mut label = String::from(&*self.name);
        let mut node = &self.root;
        for (key, value) in entries {
            let Some(next) = node.branches(key.as_ref()).and_then(|b| b.find(value.as_ref())) else {
                break;
            };
            node = next;
            label.push('.');
            label.push_str(node.segment());
            let detailed = node.rule.as_ref().is_some_and(|r| r.detailed_metric);
            if (node.value_to_metric || detailed) && node.segment().len() == key.as_ref().len() {
                label.push('_');
                label.push_str(value.as_ref());
            }
        }
        label
    }
}

impl Node {
    /// A node labelled `segment` under a parent labelled `parent` (no parent: the domain's root).
    pub(super) fn new(parent: Option<&str>, segment: &str) -> Node {
        let (label, segment_at) = match parent {
            Some(parent) => (format!("{parent}.{segment}"), parent.len() + 1),
            None => (segment.to_string(), 0),
        };
        Node {
            label: Arc::from(label),
            segment_at: u32::try_from(segment_at).unwrap_or(u32::MAX),
            ..Node::default()
        }
    }

    /// The nodes of the next level under `key`.
    fn branches(&self, key: &str) -> Option<&Branches> {
        self.children.as_ref()?.get(key)
    }

    /// The nodes of the next level under `key`, created empty if there are none yet.
    pub(super) fn branches_mut(&mut self, key: Box<str>) -> &mut Branches {
        self.children.get_or_insert_default().entry(key).or_default()
    }

    /// The label of this level in metric paths: `key` or `key_value`.
    pub(super) fn segment(&self) -> &str {
        self.label.get(self.segment_at as usize..).unwrap_or_default()
    }

    /// The rule on the node the last entry lands on: one entry per level, no backtracking.
    fn find_path<'a, K: AsRef<str>, V: AsRef<str>>(&'a self, entries: &[(K, V)]) -> Option<Match<'a>> {
        let mut node = self;
        let mut shared = Vec::new();
        for (depth, (key, value)) in entries.iter().enumerate() {
            let branches = node.branches(key.as_ref())?;
            node = branches.find(value.as_ref())?;
            if let Some(pattern) = &node.shared_value {
                shared.push((depth, &**pattern));
            }
        }
        Some(Match {
            rule: node.rule.as_deref()?,
            shared,
        })
    }
}

impl Branches {
    fn find(&self, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(value) {
            return Some(node);
        }
        if let Some((_, node)) = self.wildcards.iter().find(|(p, _)| p.matches(value)) {
            return Some(node);
        }
        self.any.as_deref()
    }
}
