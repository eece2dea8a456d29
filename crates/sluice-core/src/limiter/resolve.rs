//! Which rule each descriptor of a request meets: a limit override, the match tree of its domain, or nothing; and
//! the rules that others `replace`, dropped.

use std::borrow::Cow;
use std::collections::HashSet;

use super::request::Request;
use crate::rules::{Algorithm, Domain, Limit, List, ListAction, LiveLists, Rule, Tier, TierCost, Unit};

/// What one request descriptor resolved to.
pub enum Target<'a> {
    NoRule,
    Unlimited(&'a Rule),
    /// Decided by a deny list, or passed by an allow list that one of the request's descriptors matched
    /// ([`listed`]): its limits are not consulted.
    Listed(&'a List),
    Limited {
        tiers: Cow<'a, [Tier]>,
        rule: Option<&'a Rule>,
        shared: Vec<(usize, &'a str)>,
    },
}

impl Target<'_> {
    /// Whether one of its limits is of an algorithm that `is` (e.g. [`Algorithm::takes_lease`]).
    pub fn has(&self, is: impl Fn(Algorithm) -> bool) -> bool {
        matches!(self, Target::Limited { tiers, .. } if tiers.iter().any(|t| is(t.limit.algorithm)))
    }
}

/// Matches every descriptor, then drops the rules named in the `replaces` of any matched rule.
pub fn resolve<'a>(domain: Option<&'a Domain>, request: &Request) -> Vec<Target<'a>> {
    let Some(domain) = domain else {
        return request.descriptors.iter().map(|_| Target::NoRule).collect();
    };
    let mut replaced: Option<HashSet<&str>> = None;
    let mut targets: Vec<Target<'a>> = request
        .descriptors
        .iter()
        .map(|d| {
            if let Some(o) = d.limit_override {
                let unit = Unit::from_override(o.unit).unwrap_or(Unit::Second);
                return Target::Limited {
                    tiers: Cow::Owned(vec![Tier {
                        limit: Limit::fixed(o.requests_per_unit, unit),
                        name: None,
                        cost: TierCost::Request,
                        global: false,
                    }]),
                    rule: None,
                    shared: Vec::new(),
                };
            }
            let Some(m) = domain.find(&d.entries) else {
                return Target::NoRule;
            };
            if !m.rule.replaces.is_empty() {
                replaced
                    .get_or_insert_with(HashSet::new)
                    .extend(m.rule.replaces.iter().map(|n| &**n));
            }
            if m.rule.tiers.is_empty() {
                Target::Unlimited(m.rule)
            } else {
                Target::Limited {
                    tiers: Cow::Borrowed(&m.rule.tiers),
                    rule: Some(m.rule),
                    shared: m.shared,
                }
            }
        })
        .collect();
    if let Some(replaced) = replaced {
        for target in &mut targets {
            if let Target::Limited { rule: Some(r), .. } | Target::Unlimited(r) = target {
                if r.is_replaced(&replaced) {
                    *target = Target::NoRule;
                }
            }
        }
    }
    targets
}

/// Applies the domain's deny and allow lists to what the descriptors resolved to: a descriptor a deny list matches is
/// decided by it; when none is denied and an allow list matches any descriptor, the whole request passes by it.
pub fn listed<'a>(domain: Option<&'a Domain>, request: &Request, targets: &mut [Target<'a>], live: Option<&LiveLists>) {
    let Some(lists) = domain.map(|d| &d.lists).filter(|l| !l.is_empty()) else {
        return;
    };
    let mut allowed = None;
    let mut denied = false;
    for (descriptor, target) in request.descriptors.iter().zip(targets.iter_mut()) {
        match lists.verdict(&descriptor.entries, live) {
            Some(list) if list.action == ListAction::Deny => {
                *target = Target::Listed(list);
                denied = true;
            }
            Some(list) => allowed = allowed.or(Some(list)),
            None => {}
        }
    }
    if let (Some(list), false) = (allowed, denied) {
        targets.iter_mut().for_each(|t| *t = Target::Listed(list));
    }
}
