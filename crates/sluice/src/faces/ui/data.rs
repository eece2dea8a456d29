//! The dashboard's data, shaped as compact JSON from the core's plain types: no I/O here, so every shape is tested
//! without a server.
//!
//! - [`Window`]: which seconds a `/ui/api/series` request asks for (`range`, `since`), checked.
//! - [`series`]: per rule, allowed and denied per second over a window (and reported, apart), as arrays aligned on
//!   epoch seconds.
//! - [`rules`]: the rules in force, every limit with its own name (a rule of several limits has several).
//! - [`shares`] and [`rlqs_in_words`]: what the RLQS streams were told and what the RLQS metrics count, in sentences.
//! - [`samples`]: this instance's Prometheus text, read back as samples.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::faces::auth::Refused;
use crate::limiter::Series;
use crate::metrics::{
    RLQS_ABANDONED, RLQS_ASSIGNMENTS, RLQS_BUCKETS, RLQS_EXHAUSTED, RLQS_STREAMS, RLQS_USAGE, RLQS_WRONGFUL_DENIALS,
};
use crate::quota::{Assigned, NO_REFILL_S, Strategy};
use crate::rules::Domain;

/// The ranges the page offers, in seconds: 1, 5 and 15 minutes. The store keeps 16 minutes of seconds.
pub const RANGES: [u64; 3] = [60, 300, 900];

/// How many seconds behind the clock the newest second served is. Each instance adds a second's counts to the store
/// at its next flush (every second, at any point of it), so a second is complete, on every instance, two seconds
/// after it began; a page that asks only for what follows the last second it has would otherwise keep a partial one.
pub const SETTLE_SECONDS: u64 = 2;

/// How far back a heartbeat counts an instance as alive (an instance beats every second).
pub const ALIVE_SECONDS: u64 = 5;

/// The seconds `from..=to` a series request asks for (empty when `from > to`: nothing new), within `range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub range: u64,
    pub from: u64,
    pub to: u64,
}

impl Window {
    /// The window of a request at `now` (epoch seconds): `range` is 60, 300 or 900 seconds (also `1m`, `5m`,
    /// `15m`; 900 when absent), ending [`SETTLE_SECONDS`] before now; `since`, when given, keeps only the seconds
    /// after it. A parameter that is not one of these is a 400 naming it.
    pub fn of(now: u64, query: &HashMap<String, String>) -> Result<Window, Refused> {
        let range = match query.get("range").map(String::as_str) {
            None | Some("") => 900,
            Some(raw) => parse_range(raw).ok_or_else(|| {
                bad(format!(
                    "range: '{raw}' is not one of 60, 300, 900 (seconds) or 1m, 5m, 15m"
                ))
            })?,
        };
        let to = now.saturating_sub(SETTLE_SECONDS);
        let mut from = (to + 1).saturating_sub(range);
        if let Some(raw) = query.get("since") {
            let since: u64 = raw
                .parse()
                .map_err(|_| bad(format!("since: '{raw}' is not a second since the Unix epoch")))?;
            from = from.max(since.saturating_add(1));
        }
        Ok(Window {
            range,
            from: from.min(to + 1),
            to,
        })
    }

    /// How many seconds it holds.
    pub fn len(&self) -> usize {
        (self.to + 1).saturating_sub(self.from) as usize
    }
}

fn parse_range(raw: &str) -> Option<u64> {
    let seconds = match raw {
        "1m" => 60,
        "5m" => 300,
        "15m" => 900,
        _ => raw.parse().ok()?,
    };
    RANGES.contains(&seconds).then_some(seconds)
}

fn bad(message: String) -> Refused {
    (StatusCode::BAD_REQUEST, message + "\n")
}

/// A domain's outcomes over `window`, from `read` (the store's seconds from `read.from` on, covering the window):
/// `{"domain", "range", "from", "to", "rules": {rule: {"allowed": [..], "denied": [..]}}, "instances": {..}}`, one
/// number per second from `from` to `to`; a rule with reported costs in the window also has `"reported": [..]`
/// (reports are no decisions: they are in neither allowed nor denied). A rule with nothing in the window is left out
/// (the page reads it as zeros), and so is `reported` when it is all zeros. `instances` are as [`instances`] shapes
/// them.
pub fn series(domain: &str, window: &Window, read: &Series, seen: &Seen) -> Value {
    let skip = window.from.saturating_sub(read.from) as usize;
    let take = |counts: &[u64]| -> Vec<u64> {
        let mut out: Vec<u64> = counts.iter().skip(skip).take(window.len()).copied().collect();
        out.resize(window.len(), 0);
        out
    };
    let mut rules = serde_json::Map::new();
    let names: BTreeSet<&String> = read.rules.keys().chain(read.reported.keys()).collect();
    for rule in names {
        let (allowed, denied) = match read.rules.get(rule) {
            Some((allowed, denied)) => (take(allowed), take(denied)),
            None => (vec![0; window.len()], vec![0; window.len()]),
        };
        let reported = read
            .reported
            .get(rule)
            .map(|r| take(r))
            .filter(|r| r.iter().any(|&n| n > 0));
        if reported.is_none() && allowed.iter().chain(&denied).all(|&n| n == 0) {
            continue;
        }
        let mut counts = json!({"allowed": allowed, "denied": denied});
        if let Some(reported) = reported {
            counts["reported"] = json!(reported);
        }
        rules.insert(rule.clone(), counts);
    }
    json!({
        "domain": domain,
        "range": window.range,
        "from": window.from,
        "to": window.to,
        "rules": rules,
        "instances": instances(seen),
    })
}

/// The instances whose heartbeat was read, by name, with the last second each was seen, and this instance's name.
pub struct Seen<'a> {
    pub instances: &'a BTreeMap<String, u64>,
    pub this: &'a str,
}

/// The instances seen: `{"count", "this", "seen": [{"instance", "last"}]}`. This instance is running, so it counts
/// even before its first heartbeat (`last` null).
pub fn instances(seen: &Seen) -> Value {
    let mut list: Vec<Value> = seen
        .instances
        .iter()
        .map(|(name, last)| json!({"instance": name, "last": last}))
        .collect();
    if !seen.instances.contains_key(seen.this) {
        list.push(json!({"instance": seen.this, "last": null}));
    }
    json!({"count": list.len(), "this": seen.this, "seen": list})
}

/// The rules of `domain`, in the order of its rule lines: `{"rule", "limits": [{"limit", "name"}], "notes"}`, every
/// limit with its own name (null when it has none), and the rule's modes in `notes`.
pub fn rules(domain: &Domain) -> Vec<Value> {
    let mut out = Vec::new();
    domain.each_rule(&mut |rule| {
        let limits: Vec<Value> = rule
            .tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                // The rule's name is its first named limit's; a limit written without a name shows the rule's.
                let name = t.name.clone().or_else(|| (i == 0).then(|| rule.name.clone()).flatten());
                json!({"limit": t.summary(), "name": name.as_deref()})
            })
            .collect();
        let mut notes = Vec::new();
        if rule.tiers.is_empty() {
            notes.push("unlimited");
        }
        if rule.shadow_mode {
            notes.push("shadow mode");
        }
        if rule.quota_mode {
            notes.push("quota mode");
        }
        if rule.bucket.is_some() {
            notes.push("RLQS bucket");
        }
        out.push(json!({"rule": &*rule.path, "limits": limits, "notes": notes}));
    });
    out
}

/// The assignments this instance's RLQS streams last sent for `domain`'s buckets: per bucket and stream, the
/// strategy, a token bucket's size, what its grant means it to hold and its part of what the bucket's streams were
/// granted, its requests denied while the bucket had quota left, how long ago it was sent, and all of it in a
/// sentence.
pub fn shares(assigned: &[Assigned], domain: &str, now_us: u64) -> Vec<Value> {
    let ours: Vec<&Assigned> = assigned.iter().filter(|a| a.domain == domain).collect();
    let bucket_name = |a: &Assigned| -> String {
        let parts: Vec<String> = a.bucket.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.join(", ")
    };
    let tokens = |a: &Assigned| match a.strategy {
        Strategy::TokenBucket { max_tokens, .. } => Some(u64::from(max_tokens)),
        _ => None,
    };
    let mut held: HashMap<String, (u64, usize)> = HashMap::new();
    for a in &ours {
        let entry = held.entry(bucket_name(a)).or_default();
        entry.0 += a.granted.unwrap_or(0);
        entry.1 += 1;
    }
    ours.iter()
        .map(|a| {
            let bucket = bucket_name(a);
            let (total, streams) = held.get(&bucket).copied().unwrap_or((0, 1));
            let stream: String = a.holder.chars().take(8).collect();
            let age_s = now_us.saturating_sub(a.sent_us) / 1_000_000;
            let share = a.granted.filter(|_| total > 0).map(|g| g as f64 / total as f64);
            let what = match a.strategy {
                Strategy::AllowAll => "to allow every request".to_string(),
                Strategy::DenyAll => "to deny every request".to_string(),
                Strategy::TokenBucket {
                    max_tokens,
                    fill_interval_s: NO_REFILL_S,
                    ..
                } => format!("to spend at most {max_tokens} (a token bucket that does not refill)"),
                Strategy::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_interval_s,
                } => format!(
                    "a token bucket of {max_tokens}, refilled by {tokens_per_fill} every {}",
                    seconds(u64::from(fill_interval_s))
                ),
            };
            let mut words = format!("Envoy stream {stream} was told {what} for {bucket}");
            match (a.granted, share) {
                (Some(granted), Some(share)) if streams > 1 => {
                    words += &format!(
                        ", granted {granted}: {:.0} % of what the bucket's {streams} streams were granted",
                        share * 100.0
                    )
                }
                (Some(granted), Some(_)) => words += &format!(", granted {granted}, the only stream granted any"),
                _ => {}
            }
            if a.wrongful > 0 {
                words += &format!(
                    "; {} denied while the bucket still had quota",
                    if a.wrongful == 1 {
                        "1 of its requests was".to_string()
                    } else {
                        format!("{} of its requests were", a.wrongful)
                    }
                );
            }
            words += &format!(
                "; sent {} ago, good for {}.",
                seconds(age_s),
                seconds(u64::from(a.ttl_s))
            );
            json!({
                "bucket": bucket,
                "stream": a.holder,
                "strategy": a.strategy.name(),
                "tokens": tokens(a),
                "granted": a.granted,
                "share": share,
                "wrongful": a.wrongful,
                "ttl_s": a.ttl_s,
                "age_s": age_s,
                "words": words,
            })
        })
        .collect()
}

/// `n` seconds in words: `1 s`, `15 s`.
fn seconds(n: u64) -> String {
    format!("{n} s")
}

/// This instance's RLQS metrics (from its Prometheus text) in sentences: the streams and buckets open, the
/// assignments sent, the usage Envoys reported, quota run out, buckets abandoned, and, when the core counts them,
/// requests denied while quota was left.
pub fn rlqs_in_words(text: &str) -> Vec<String> {
    let mut values: BTreeMap<(String, String), f64> = BTreeMap::new();
    for s in samples(text, "sluice_rlqs_", None) {
        let name = s["metric"].as_str().unwrap_or_default().to_string();
        let label = s["labels"]
            .as_object()
            .and_then(|l| l.values().next())
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        *values.entry((name, label)).or_default() += s["value"].as_f64().unwrap_or(0.0);
    }
    let get = |name: &str, label: &str| values.get(&(name.to_string(), label.to_string())).copied();
    let sum = |name: &str| -> Option<f64> {
        let mut it = values
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, v)| *v)
            .peekable();
        it.peek().is_some().then(|| it.sum())
    };
    let n = |v: f64| format!("{}", v as u64);
    let plural = |v: f64, one: &str, many: &str| format!("{} {}", n(v), if v as u64 == 1 { one } else { many });
    let mut words = Vec::new();
    let streams = get(RLQS_STREAMS, "").unwrap_or(0.0);
    let buckets = get(RLQS_BUCKETS, "").unwrap_or(0.0);
    words.push(format!(
        "{} open on this instance, reporting {}.",
        plural(streams, "RLQS stream is", "RLQS streams are"),
        plural(buckets, "bucket", "buckets")
    ));
    let sent: Vec<String> = [
        ("token_bucket", "a token bucket"),
        ("allow_all", "allow all"),
        ("deny_all", "deny all"),
    ]
    .iter()
    .filter_map(|(label, what)| {
        let v = get(RLQS_ASSIGNMENTS, label)?;
        (v > 0.0).then(|| format!("{} {what}", plural(v, "time", "times")))
    })
    .collect();
    if !sent.is_empty() {
        words.push(format!("Assignments sent: {}.", sent.join(", ")));
    }
    let allowed = get(RLQS_USAGE, "allowed").unwrap_or(0.0);
    let denied = get(RLQS_USAGE, "denied").unwrap_or(0.0);
    if allowed + denied > 0.0 {
        words.push(format!(
            "Envoys reported {} allowed and {} denied.",
            plural(allowed, "request", "requests"),
            n(denied)
        ));
    }
    if let Some(v) = get(RLQS_EXHAUSTED, "").filter(|v| *v > 0.0) {
        words.push(format!("A bucket's quota ran out {}.", plural(v, "time", "times")));
    }
    if let Some(v) = get(RLQS_ABANDONED, "").filter(|v| *v > 0.0) {
        words.push(format!(
            "{} abandoned: their Envoy reported nothing for too long.",
            plural(v, "bucket was", "buckets were")
        ));
    }
    if let Some(v) = sum(RLQS_WRONGFUL_DENIALS) {
        // Per bucket rule, the most first.
        let mut rules: BTreeMap<String, f64> = BTreeMap::new();
        for s in samples(text, RLQS_WRONGFUL_DENIALS, None) {
            let rule = s["labels"]["rule"].as_str().unwrap_or_default().to_string();
            *rules.entry(rule).or_default() += s["value"].as_f64().unwrap_or(0.0);
        }
        let mut rules: Vec<(String, f64)> = rules.into_iter().filter(|(r, _)| !r.is_empty()).collect();
        rules.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let by_rule: Vec<String> = rules.iter().map(|(r, v)| format!("{r} {}", n(*v))).collect();
        let by_rule = if by_rule.is_empty() {
            String::new()
        } else {
            format!(" ({})", by_rule.join(", "))
        };
        words.push(format!(
            "{} denied while their bucket still had quota{by_rule}.",
            plural(v, "request was", "requests were")
        ));
    }
    words
}

/// The samples of this instance's metrics whose name starts with `prefix` (and, when `domain` is given, labelled
/// with it): `{"metric": name, "labels": {...}, "value": v}` each.
pub fn samples(text: &str, prefix: &str, domain: Option<&str>) -> Vec<Value> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels: serde_json::Map<String, Value> = labels
                .split("\",")
                .filter_map(|pair| {
                    let (k, v) = pair.split_once("=\"")?;
                    Some((k.to_string(), Value::from(v.trim_end_matches('"'))))
                })
                .collect();
            if domain.is_some_and(|d| labels.get("domain").and_then(|v| v.as_str()) != Some(d)) {
                return None;
            }
            Some(json!({"metric": name, "labels": labels, "value": value}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const NOW: u64 = 1_000_000;

    #[test]
    fn a_range_ends_two_seconds_before_now() {
        for (raw, range) in [("60", 60), ("1m", 60), ("300", 300), ("5m", 300), ("15m", 900)] {
            let w = Window::of(NOW, &query(&[("range", raw)])).unwrap();
            assert_eq!((w.range, w.to, w.len()), (range, NOW - 2, range as usize), "{raw}");
            assert_eq!(w.from, NOW - 1 - range);
        }
        assert_eq!(
            Window::of(NOW, &query(&[])).unwrap().range,
            900,
            "15 minutes by default"
        );
    }

    #[test]
    fn since_keeps_the_seconds_after_it() {
        let w = Window::of(NOW, &query(&[("range", "60"), ("since", &(NOW - 5).to_string())])).unwrap();
        assert_eq!((w.from, w.to, w.len()), (NOW - 4, NOW - 2, 3));
        // Nothing new: an empty window just after what the page has.
        let w = Window::of(NOW, &query(&[("since", &(NOW - 2).to_string())])).unwrap();
        assert_eq!((w.from, w.len()), (NOW - 1, 0));
        let w = Window::of(NOW, &query(&[("since", &(NOW + 50).to_string())])).unwrap();
        assert_eq!(w.len(), 0, "a clock ahead of ours asks for nothing");
        // Older than the range: the range wins.
        let w = Window::of(NOW, &query(&[("range", "1m"), ("since", "5")])).unwrap();
        assert_eq!(w.len(), 60);
    }

    #[test]
    fn bad_parameters_are_400_naming_them() {
        for (key, raw) in [
            ("range", "61"),
            ("range", "1h"),
            ("range", "-60"),
            ("since", "yesterday"),
            ("since", "-1"),
        ] {
            let (status, message) = Window::of(NOW, &query(&[(key, raw)])).unwrap_err();
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(message.starts_with(&format!("{key}: '{raw}'")), "{message}");
        }
    }

    #[test]
    fn series_are_arrays_aligned_on_the_window() {
        let read = Series {
            from: NOW - 9,
            rules: [
                ("edge.a".to_string(), ((1..=10).collect(), vec![0; 10])),
                (
                    "edge.quiet".to_string(),
                    (vec![5, 0, 0, 0, 0, 0, 0, 0, 0, 0], vec![0; 10]),
                ),
            ]
            .into(),
            reported: [
                ("edge.a".to_string(), vec![0; 10]),
                ("edge.costs".to_string(), vec![0, 0, 0, 0, 0, 0, 3, 0, 0, 1]),
            ]
            .into(),
        };
        let alive = [("abc".to_string(), NOW - 1)].into();
        let seen = Seen {
            instances: &alive,
            this: "abc",
        };
        let window = Window {
            range: 60,
            from: NOW - 5,
            to: NOW - 2,
        };
        let json = series("edge", &window, &read, &seen);
        assert_eq!(json["from"], NOW - 5);
        assert_eq!(json["to"], NOW - 2);
        assert_eq!(
            json["rules"]["edge.a"]["allowed"],
            json!([5, 6, 7, 8]),
            "second from+i at index i"
        );
        assert_eq!(json["rules"]["edge.a"]["denied"], json!([0, 0, 0, 0]));
        assert!(
            json["rules"]["edge.a"].get("reported").is_none(),
            "no reports in the window: left out"
        );
        assert_eq!(
            json["rules"]["edge.costs"],
            json!({"allowed": [0, 0, 0, 0], "denied": [0, 0, 0, 0], "reported": [0, 0, 3, 0]}),
            "reports apart from the decisions"
        );
        assert!(
            json["rules"].get("edge.quiet").is_none(),
            "nothing in the window: left out"
        );
        assert_eq!(
            json["instances"],
            json!({"count": 1, "this": "abc", "seen": [{"instance": "abc", "last": NOW - 1}]})
        );
        let empty = Window {
            range: 60,
            from: NOW - 1,
            to: NOW - 2,
        };
        assert_eq!(series("edge", &empty, &read, &seen)["rules"], json!({}));
        let before_its_first_beat = Seen {
            instances: &Default::default(),
            this: "abc",
        };
        assert_eq!(
            instances(&before_its_first_beat),
            json!({"count": 1, "this": "abc", "seen": [{"instance": "abc", "last": null}]}),
            "the instance answering is running"
        );
    }

    #[test]
    fn rlqs_metrics_read_as_sentences() {
        let text = "sluice_rlqs_streams 2\nsluice_rlqs_buckets 1\n\
            sluice_rlqs_assignments_total{strategy=\"token_bucket\"} 3\nsluice_rlqs_assignments_total{strategy=\"deny_all\"} 1\n\
            sluice_rlqs_usage_total{result=\"allowed\"} 11\nsluice_rlqs_usage_total{result=\"denied\"} 2\n\
            sluice_rlqs_quota_exhausted_total 1\n";
        assert_eq!(
            rlqs_in_words(text),
            [
                "2 RLQS streams are open on this instance, reporting 1 bucket.",
                "Assignments sent: 3 times a token bucket, 1 time deny all.",
                "Envoys reported 11 requests allowed and 2 denied.",
                "A bucket's quota ran out 1 time.",
            ]
        );
        let wrongful = format!(
            "{text}sluice_rlqs_wrongful_denials_total{{domain=\"q\",rule=\"q.a\"}} 1\n\
             sluice_rlqs_wrongful_denials_total{{domain=\"q\",rule=\"q.b\"}} 3\n"
        );
        assert_eq!(
            rlqs_in_words(&wrongful).last().unwrap(),
            "4 requests were denied while their bucket still had quota (q.b 3, q.a 1)."
        );
        assert_eq!(
            rlqs_in_words(""),
            ["0 RLQS streams are open on this instance, reporting 0 buckets."]
        );
    }

    #[test]
    fn shares_say_who_holds_what() {
        let bucket: crate::quota::BucketId = [("name".to_string(), "per_user".to_string())].into_iter().collect();
        let assigned = |holder: &str, max_tokens| Assigned {
            holder: holder.into(),
            domain: "q".into(),
            bucket: bucket.clone(),
            strategy: Strategy::TokenBucket {
                max_tokens,
                tokens_per_fill: max_tokens,
                fill_interval_s: 60,
            },
            granted: Some(u64::from(max_tokens)),
            wrongful: 0,
            sent_us: 10_000_000,
            ttl_s: 15,
        };
        let all = [assigned("aaaaaaaaaaaa", 30), assigned("bbbbbbbbbbbb", 10)];
        let shares = shares(&all, "q", 12_000_000);
        assert_eq!(shares.len(), 2);
        assert_eq!(shares[0]["share"], 0.75);
        assert_eq!(
            shares[0]["words"],
            "Envoy stream aaaaaaaa was told a token bucket of 30, refilled by 30 every 60 s for name=per_user, \
             granted 30: 75 % of what the bucket's 2 streams were granted; sent 2 s ago, good for 15 s."
        );
        assert!(super::shares(&all, "other", 0).is_empty());
        let grant = Assigned {
            strategy: Strategy::TokenBucket {
                max_tokens: 5,
                tokens_per_fill: 1,
                fill_interval_s: NO_REFILL_S,
            },
            granted: Some(5),
            wrongful: 4,
            ..assigned("cccccccccccc", 0)
        };
        assert_eq!(
            super::shares(&[grant], "q", 12_000_000)[0]["words"],
            "Envoy stream cccccccc was told to spend at most 5 (a token bucket that does not refill) for \
             name=per_user, granted 5, the only stream granted any; 4 of its requests were denied while the bucket \
             still had quota; sent 2 s ago, good for 15 s."
        );
    }

    #[test]
    fn samples_are_read_from_prometheus_text() {
        let text = "# HELP x\nsluice_rlqs_streams 2\nsluice_rule_cost_total{domain=\"llm\",rule=\"llm.user\",limit=\"0\",kind=\"reserved\"} 1200\nsluice_rule_cost_total{domain=\"other\",rule=\"o\",limit=\"0\",kind=\"reported\"} 5\n";
        let rlqs = samples(text, "sluice_rlqs_", None);
        assert_eq!(
            rlqs,
            [json!({"metric": "sluice_rlqs_streams", "labels": {}, "value": 2.0})]
        );
        let budgets = samples(text, "sluice_rule_cost_total", Some("llm"));
        assert_eq!(budgets.len(), 1);
        assert_eq!(budgets[0]["labels"]["kind"], "reserved");
        assert_eq!(budgets[0]["value"], 1200.0);
    }
}
