//! The text summary of a compiled rule set: [`RuleSet::summary`], what `sluice check` prints, the service's
//! `/rlconfig` page serves and a (re)load logs the first line of; one line per rule, in a stable order.
//!
//! It only reads the tree, so it lives apart from the compiler that builds it and the matching that serves requests.

use super::RuleSet;
use super::tree::{Domain, Node, Rule};
use super::vocabulary::Tier;

impl RuleSet {
    /// The first line of the summary: how many files, domains and rules (what a (re)load logs).
    pub fn headline(&self) -> String {
        format!(
            "{} file(s), {} domain(s), {} rule(s)",
            self.files,
            self.domains.len(),
            self.rules
        )
    }

    /// A human summary for `sluice check` and `/rlconfig`: the headline, then domains and their rules.
    pub fn summary(&self) -> String {
        let mut names: Vec<&Domain> = self.domains.values().collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = self.headline();
        out.push('\n');
        for domain in names {
            out.push_str(&format!("domain {}\n", domain.name));
            domain.each_rule(&mut |rule| {
                out.push_str(&format!("  {}: {}\n", rule.path, describe(rule)));
            });
            for line in domain.lists.lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        out
    }
}

impl Domain {
    /// One line per rule, in a stable order: `path: limit`.
    pub fn rule_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.each_rule(&mut |rule| out.push(format!("{}: {}", rule.path, describe(rule))));
        out
    }

    /// Every rule, in the stable order of [`Domain::rule_lines`].
    pub fn each_rule(&self, f: &mut dyn FnMut(&Rule)) {
        fn walk(node: &Node, f: &mut dyn FnMut(&Rule)) {
            if let Some(rule) = &node.rule {
                f(rule);
            }
            let mut keys: Vec<_> = node.children.iter().flat_map(|c| c.iter()).collect();
            keys.sort_by(|a, b| a.0.cmp(b.0));
            for (_, b) in keys {
                let mut exact: Vec<_> = b.exact.iter().collect();
                exact.sort_by(|a, b| a.0.cmp(b.0));
                exact.into_iter().for_each(|(_, n)| walk(n, f));
                b.wildcards.iter().for_each(|(_, n)| walk(n, f));
                b.any.iter().for_each(|n| walk(n, f));
            }
        }
        walk(&self.root, f);
        walk(&self.buckets, f);
    }
}

fn describe(rule: &Rule) -> String {
    // Every limit with its own name: a rule of several named limits is reported under each of them.
    let mut s = if rule.tiers.is_empty() {
        let mut s = "unlimited".to_string();
        if let Some(name) = &rule.name {
            s.push_str(&format!(", name {name}"));
        }
        s
    } else {
        let tiers: Vec<String> = rule
            .tiers
            .iter()
            .map(|tier| match &tier.name {
                Some(name) => format!("{}, name {name}", describe_tier(tier)),
                None => describe_tier(tier),
            })
            .collect();
        tiers.join(" and ")
    };
    if rule.shadow_mode {
        s.push_str(", shadow mode");
    }
    if rule.quota_mode {
        s.push_str(", quota mode");
    }
    if let Some(r) = &rule.record {
        s.push_str(&format!(", records last {} '{}'", r.size, r.key));
    }
    s
}

impl Tier {
    /// The limit in words, without its name: `10 per second (fixed_window)`.
    pub fn summary(&self) -> String {
        describe_tier(self)
    }
}

fn describe_tier(tier: &Tier) -> String {
    let l = &tier.limit;
    let per = if l.multiplier == 1 {
        l.unit.name().to_string()
    } else {
        format!("{} {}s", l.multiplier, l.unit.name())
    };
    let mut s = format!("{} per {per} ({}", l.requests, l.algorithm.name());
    if l.algorithm.is_bucket() {
        s.push_str(&format!(", burst {}", l.burst));
    }
    s.push(')');
    s
}
