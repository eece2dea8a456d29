//! A domain's deny and allow `lists`: named sets of one descriptor key's values (exact, `*` wildcards, IPv4 and IPv6
//! addresses and CIDR ranges), checked before the limits. A value matches a list when it equals one of its exact
//! values, matches one of its patterns, or is an IP address inside one of its ranges (an IPv4-mapped IPv6 address as
//! its IPv4 address). Ranges are kept merged and sorted, one pair of integers each, and found by binary search: a
//! million of them take 8 bytes each (IPv4) or 32 (IPv6), and a lookup about twenty comparisons.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::pattern::Pattern;
use crate::config::{RawList, list_lines};

/// What a list does to a request one of whose descriptors it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListAction {
    /// The descriptor is over the limit, whatever its limits say; nothing is counted for it.
    Deny,
    /// The request skips the domain's limits: every descriptor passes, nothing is counted.
    Allow,
}

impl ListAction {
    pub fn name(self) -> &'static str {
        match self {
            ListAction::Deny => "deny",
            ListAction::Allow => "allow",
        }
    }
}

/// One compiled list: its configured values, and where more of them come from at run time.
#[derive(Debug)]
pub struct List {
    pub name: Arc<str>,
    pub action: ListAction,
    /// The descriptor key whose values it holds.
    pub key: Arc<str>,
    /// The values of `values` and `file`.
    configured: Matcher,
    /// The URL it is fetched from, if any.
    pub source: Option<ListSource>,
}

/// A list fetched from a URL and fetched again every `refresh`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListSource {
    pub url: String,
    pub refresh: Duration,
}

/// How often a list is fetched from its URL unless it says otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(3_600);

/// A set of values to match: exact values, `*` patterns, and ranges of IPv4 and IPv6 addresses.
#[derive(Debug, Default)]
pub struct Matcher {
    exact: HashSet<Box<str>>,
    patterns: Vec<Pattern>,
    v4: Ranges<u32>,
    v6: Ranges<u128>,
}

/// Inclusive ranges, sorted and merged (none overlaps or touches another).
#[derive(Debug, Default)]
struct Ranges<T>(Vec<(T, T)>);

impl<T: Copy + Ord + num_step::Step> Ranges<T> {
    fn build(mut ranges: Vec<(T, T)>) -> Ranges<T> {
        ranges.sort_unstable();
        let mut merged: Vec<(T, T)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1.next_or_max() => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged.shrink_to_fit();
        Ranges(merged)
    }

    fn contains(&self, value: T) -> bool {
        // The last range starting at or before the value.
        let after = self.0.partition_point(|&(start, _)| start <= value);
        after > 0 && value <= self.0[after - 1].1
    }
}

/// The successor of an integer, for merging ranges that touch.
mod num_step {
    pub trait Step {
        fn next_or_max(self) -> Self;
    }
    impl Step for u32 {
        fn next_or_max(self) -> u32 {
            self.saturating_add(1)
        }
    }
    impl Step for u128 {
        fn next_or_max(self) -> u128 {
            self.saturating_add(1)
        }
    }
}

impl Matcher {
    /// The matcher of `values`, each with what names it in an error (an index, a line number).
    pub fn new<'v, N: std::fmt::Display>(
        values: impl IntoIterator<Item = (N, &'v str)>,
    ) -> Result<Matcher, (N, String)> {
        let mut entries = Entries::default();
        for (at, value) in values {
            if let Err(message) = entries.add(value) {
                return Err((at, message));
            }
        }
        Ok(entries.build())
    }

    /// The matcher of a list's text: one value per line, `#` starting a comment, blank lines skipped. An error names
    /// the line.
    pub fn from_text(text: &str) -> Result<Matcher, String> {
        Matcher::new(list_lines(text)).map_err(|(line, message)| format!("line {line}: {message}"))
    }

    pub fn matches(&self, value: &str) -> bool {
        if self.exact.contains(value) || self.patterns.iter().any(|p| p.matches(value)) {
            return true;
        }
        match value.parse::<IpAddr>().map(canonical) {
            Ok(IpAddr::V4(a)) => self.v4.contains(u32::from(a)),
            Ok(IpAddr::V6(a)) => self.v6.contains(u128::from(a)),
            Err(_) => false,
        }
    }

    /// How many entries it holds (ranges after merging).
    pub fn len(&self) -> usize {
        self.exact.len() + self.patterns.len() + self.v4.0.len() + self.v6.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes its entries take (the ranges, the patterns and the exact values, with their tables' capacity).
    pub fn memory_bytes(&self) -> usize {
        let strings: usize = self.exact.iter().map(|v| v.len() + 16).sum();
        let patterns: usize = self.patterns.iter().map(Pattern::memory_bytes).sum();
        strings + self.exact.capacity() * 8 + patterns + self.v4.0.capacity() * 8 + self.v6.0.capacity() * 32
    }
}

/// Whether `value` can be a list entry: the error says why not.
pub fn check_value(value: &str) -> Result<(), String> {
    Entries::default().add(value)
}

impl List {
    /// Whether its configured values match `value` (what is added at run time is in [`LiveList`]).
    pub fn matches(&self, value: &str) -> bool {
        self.configured.matches(value)
    }

    /// How many configured entries it holds (ranges after merging).
    pub fn len(&self) -> usize {
        self.configured.len()
    }

    pub fn is_empty(&self) -> bool {
        self.configured.is_empty()
    }

    /// The bytes its configured entries take.
    pub fn memory_bytes(&self) -> usize {
        self.configured.memory_bytes()
    }
}

/// What a list holds beyond its configuration, at run time: the values last fetched from its URL, and the entries
/// managed through the admin API (those not yet expired).
#[derive(Debug, Default, Clone)]
pub struct LiveList {
    pub fetched: Option<Arc<Matcher>>,
    pub managed: Option<Arc<Matcher>>,
}

impl LiveList {
    fn matches(&self, value: &str) -> bool {
        self.fetched.as_ref().is_some_and(|m| m.matches(value))
            || self.managed.as_ref().is_some_and(|m| m.matches(value))
    }
}

/// A domain's live lists, by list name.
pub type LiveLists = HashMap<Arc<str>, LiveList>;

/// An IPv4-mapped IPv6 address as its IPv4 address.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// A domain's lists, by the descriptor key they apply to.
#[derive(Debug, Default)]
pub struct Lists {
    by_key: HashMap<Box<str>, Vec<List>>,
}

impl Lists {
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The first list (deny lists first, then in configuration order) that one of `entries` matches, by its
    /// configured values or by what `live` holds for it.
    pub fn verdict<'a>(&'a self, entries: &[(String, String)], live: Option<&LiveLists>) -> Option<&'a List> {
        let mut allowed = None;
        for (key, value) in entries {
            for list in self.by_key.get(key.as_str()).into_iter().flatten() {
                let live = || live.and_then(|l| l.get(&list.name)).is_some_and(|l| l.matches(value));
                if list.matches(value) || live() {
                    if list.action == ListAction::Deny {
                        return Some(list);
                    }
                    allowed = allowed.or(Some(list));
                }
            }
        }
        allowed
    }

    /// Every list, for summaries and metrics.
    pub fn iter(&self) -> impl Iterator<Item = &List> {
        self.by_key.values().flatten()
    }

    /// The list named `name`.
    pub fn get(&self, name: &str) -> Option<&List> {
        self.iter().find(|l| &*l.name == name)
    }

    /// One line per list, by name: `list NAME: ACTION KEY, N entries` (and where it is fetched from).
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<(&str, String)> = self
            .by_key
            .iter()
            .flat_map(|(key, lists)| {
                lists.iter().map(move |l| {
                    let mut line = format!("list {}: {} {key}, {} entries", l.name, l.action.name(), l.len());
                    if let Some(source) = &l.source {
                        line += &format!(" + {} every {}s", source.url, source.refresh.as_secs());
                    }
                    (&*l.name, line)
                })
            })
            .collect();
        lines.sort();
        lines.into_iter().map(|(_, line)| line).collect()
    }
}

impl Lists {
    /// Compiles the `lists` of the domain `domain` into these; `keys` are the descriptor keys its rules use (a list
    /// of another key could never apply). An error is the path of the offending key and what is wrong with it.
    pub(super) fn compile(
        &mut self,
        raw: &[RawList],
        keys: &HashSet<String>,
        domain: &str,
    ) -> Result<(), (String, String)> {
        let mut names: HashSet<String> = self.iter().map(|l| l.name.to_string()).collect();
        for (i, r) in raw.iter().enumerate() {
            let at = |field: &str| format!("lists[{i}].{field}");
            if r.name.is_empty() {
                return Err((at("name"), "a list needs a name".into()));
            }
            if !names.insert(r.name.clone()) {
                return Err((at("name"), format!("duplicate list name '{}'", r.name)));
            }
            if r.key.is_empty() {
                return Err((
                    at("key"),
                    "a list needs the descriptor key whose values it holds".into(),
                ));
            }
            if !keys.contains(&r.key) {
                return Err((
                    at("key"),
                    format!("'{}' is not a descriptor key of domain '{domain}'", r.key),
                ));
            }
            let action = match r.action.as_deref() {
                None | Some("deny") => ListAction::Deny,
                Some("allow") => ListAction::Allow,
                Some(other) => {
                    return Err((
                        at("action"),
                        format!("unknown action '{other}' (expected deny or allow)"),
                    ));
                }
            };
            let mut list = Entries::default();
            for (j, v) in r.values.iter().enumerate() {
                list.add(v).map_err(|m| (at(&format!("values[{j}]")), m))?;
            }
            let file = r.file.as_deref().unwrap_or_default();
            for (line, v) in &r.file_values {
                list.add(v)
                    .map_err(|m| (at("file"), format!("'{file}' line {line}: {m}")))?;
            }
            let source = match &r.url {
                None if r.refresh_seconds.is_some() => {
                    return Err((at("refresh_seconds"), "only a list with a url is refreshed".into()));
                }
                None => None,
                Some(url) => Some(ListSource {
                    url: check_url(url).map_err(|m| (at("url"), m))?,
                    refresh: match r.refresh_seconds {
                        None => DEFAULT_REFRESH,
                        Some(0) => return Err((at("refresh_seconds"), "must be at least 1".into())),
                        Some(s) => Duration::from_secs(s),
                    },
                }),
            };
            self.by_key.entry(r.key.as_str().into()).or_default().push(List {
                name: Arc::from(r.name.as_str()),
                action,
                key: Arc::from(r.key.as_str()),
                configured: list.build(),
                source,
            });
        }
        Ok(())
    }
}

/// A list URL as it is fetched: `http://` or `https://`, a host, no spaces.
fn check_url(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("'{url}' is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') || url.contains(char::is_whitespace) {
        return Err(format!("'{url}' has no host or holds a space"));
    }
    Ok(url.to_string())
}

/// A list's entries as they are read.
#[derive(Default)]
struct Entries {
    exact: HashSet<Box<str>>,
    patterns: Vec<Pattern>,
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl Entries {
    fn build(self) -> Matcher {
        Matcher {
            exact: self.exact,
            patterns: self.patterns,
            v4: Ranges::build(self.v4),
            v6: Ranges::build(self.v6),
        }
    }

    /// Adds one value: a CIDR range (`a/n`), an address, a pattern (with `*`), or an exact value.
    fn add(&mut self, value: &str) -> Result<(), String> {
        if value.is_empty() {
            return Err("an empty value".into());
        }
        // A range: an address (digits, hex digits, dots and colons, with a dot or a colon), '/', a prefix length. A
        // value such as a user agent (`curl/8.0`) is not one.
        let ip_like =
            |s: &str| s.contains(['.', ':']) && s.chars().all(|c| c.is_ascii_hexdigit() || c == '.' || c == ':');
        if let Some((addr, bits)) = value.split_once('/').filter(|(a, _)| ip_like(a) || a.is_empty()) {
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| format!("'{value}' is not a CIDR range: bad address"))?;
            let bits: u32 = bits
                .parse()
                .map_err(|_| format!("'{value}' is not a CIDR range: bad prefix length"))?;
            // An IPv4-mapped range, as its IPv4 range.
            let v4 = match addr {
                IpAddr::V4(a) => Some((a, bits)),
                IpAddr::V6(a) if bits >= 96 => a.to_ipv4_mapped().map(|m| (m, bits - 96)),
                IpAddr::V6(_) => None,
            };
            match (addr, v4) {
                (_, Some((a, bits))) if bits <= 32 => {
                    let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
                    let start = u32::from(a) & mask;
                    self.v4.push((start, start | !mask));
                }
                (IpAddr::V6(a), None) if bits <= 128 => {
                    let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
                    let start = u128::from(a) & mask;
                    self.v6.push((start, start | !mask));
                }
                _ => return Err(format!("'{value}' is not a CIDR range: prefix length too long")),
            }
            return Ok(());
        }
        match value.parse::<IpAddr>().map(canonical) {
            Ok(IpAddr::V4(a)) => self.v4.push((u32::from(a), u32::from(a))),
            Ok(IpAddr::V6(a)) => self.v6.push((u128::from(a), u128::from(a))),
            Err(_) if value.contains('*') => self.patterns.push(Pattern::new(value)),
            Err(_) => {
                self.exact.insert(value.into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(values: &[&str]) -> Matcher {
        Matcher::new(values.iter().map(|v| (0, *v))).unwrap()
    }

    #[test]
    fn values_match_exactly_by_pattern_and_by_range() {
        let l = list(&[
            "10.0.0.0/8",
            "192.168.1.7",
            "2001:db8::/32",
            "bot-*",
            "curl/8.0",
            "0.0.0.0/0",
        ]);
        assert!(l.matches("10.255.0.1") && l.matches("192.168.1.7") && l.matches("bot-crawler"));
        assert!(l.matches("2001:db8:1::5") && l.matches("curl/8.0"));
        assert!(!l.matches("2001:db9::1") && !l.matches("curl/7.0") && !l.matches("robot"));
        // 0.0.0.0/0 covers every IPv4 address, mapped ones too, and no IPv6 address.
        assert!(l.matches("8.8.8.8") && l.matches("::ffff:8.8.8.8") && !l.matches("2001:db9::1"));
        let m = list(&["10.0.0.0/8", "::ffff:172.16.0.0/108"]);
        assert!(m.matches("::ffff:10.1.2.3"), "a v4-mapped address matches its v4 range");
        assert!(m.matches("172.16.200.1") && !m.matches("172.32.0.1"));
    }

    #[test]
    fn ranges_merge_and_edges_hold() {
        let l = list(&["10.0.0.0/24", "10.0.1.0/24", "10.0.0.128/25", "255.255.255.255", "::/0"]);
        assert_eq!(l.v4.0.len(), 2, "{:?}", l.v4.0);
        for (v, want) in [
            ("10.0.0.0", true),
            ("10.0.1.255", true),
            ("10.0.2.0", false),
            ("9.255.255.255", false),
        ] {
            assert_eq!(l.matches(v), want, "{v}");
        }
        assert!(l.matches("255.255.255.255") && l.matches("::1") && l.matches("ffff::"));
    }

    #[test]
    fn malformed_ranges_are_refused() {
        let mut e = Entries::default();
        for bad in [
            "10.0.0.0/33",
            "10.0.0/8",
            "10.0.0.0/x",
            "::/129",
            "/8",
            "",
            "1.2.3.4.5/8",
        ] {
            assert!(e.add(bad).is_err(), "{bad}");
        }
    }
}
