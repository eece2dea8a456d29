//! Deny and allow lists in the domain file: exact values, wildcards and CIDR ranges of one descriptor key; a deny
//! list decides its descriptor (nothing counted), an allow list lets the whole request skip the limits; values from a
//! file next to the configuration, read again on reload; entries managed at run time, with TTLs, shared by the
//! instances on one Redis within a second; every mistake named with its file and path.

use std::path::Path;
use std::sync::Arc;

use sluice_core::config::{ConfigError, load};
use sluice_core::limiter::{Code, Descriptor, LimitError, Limiter, LimiterSettings, Report, Request};
use sluice_core::metrics::Metrics;
use sluice_core::rules::{ListAction, RuleSet};
use sluice_core::store::Store;
use sluice_core::store::redis::RedisStore;

use crate::harness::{ACL_PASSWORD, RedisServer, limiter_with, readme_acl_user, redis_store};
use sluice_core::store::{Announcements, Lists};

/// A limiter whose keys carry the prefix the documented ACL user may use.
fn limiter<S: Store>(yaml: &str, store: S) -> (Arc<Limiter<S>>, Arc<sluice_core::clock::ManualClock>) {
    let settings = LimiterSettings {
        key_prefix: "test:".into(),
        ..LimiterSettings::default()
    };
    limiter_with(yaml, store, settings)
}

const CONFIG: &str = "
domain: edge
lists:
  - {name: blocked, key: remote_address, values: ['10.0.0.0/8', '2001:db8::/32', '192.0.2.7']}
  - {name: bots, key: user_agent, action: deny, values: ['BadBot*', 'curl/7.0']}
  - {name: internal, key: remote_address, action: allow, values: ['172.16.0.0/12', '10.9.9.9']}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user_agent
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

fn req(descriptors: &[(&str, &str)]) -> Request {
    Request {
        domain: "edge".into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| Descriptor {
                entries: vec![(k.to_string(), v.to_string())],
                ..Descriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

every_store!(
    a_deny_list_decides_its_descriptor_and_counts_nothing,
    an_allow_list_lets_the_request_skip_every_limit,
    entries_added_at_run_time_deny_at_once_and_expire_on_the_clock,
);

async fn a_deny_list_decides_its_descriptor_and_counts_nothing(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    for ip in ["10.1.2.3", "::ffff:10.1.2.3", "2001:db8::1", "192.0.2.7"] {
        let d = l
            .decisions()
            .should_rate_limit(&req(&[("remote_address", ip), ("user", "u")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::OverLimit, "{ip}");
        assert_eq!(
            (d.statuses[0].code, d.statuses[0].limit.is_none()),
            (Code::OverLimit, true),
            "{ip}"
        );
        assert_eq!(d.lists, [(ListAction::Deny, "blocked".into())], "{ip}");
    }
    // Nothing was counted for a denied descriptor: GetRemaining (which reports the limits, not the lists) finds the
    // listed address's limit untouched after its four denials.
    let Report::Limited { remaining, .. } = &l
        .decisions()
        .get_remaining(&req(&[("remote_address", "10.1.2.3")]), 1)
        .await
        .unwrap()[0]
    else {
        panic!("the address has a limit")
    };
    assert_eq!(*remaining, 2);
    // The other descriptor of those requests was counted as usual: 4 hits on a limit of 2.
    let d = l.decisions().should_rate_limit(&req(&[("user", "u")])).await.unwrap();
    assert_eq!(
        d.overall,
        Code::OverLimit,
        "the user's own limit counted the listed requests"
    );
    for ua in ["BadBot/2.1", "curl/7.0"] {
        let d = l
            .decisions()
            .should_rate_limit(&req(&[("user_agent", ua)]))
            .await
            .unwrap();
        assert_eq!(
            (d.overall, d.lists.clone()),
            (Code::OverLimit, vec![(ListAction::Deny, "bots".into())])
        );
    }
    for ua in ["GoodBot", "curl/8.0", "badbot"] {
        let d = l
            .decisions()
            .should_rate_limit(&req(&[("user_agent", ua)]))
            .await
            .unwrap();
        assert_eq!((d.overall, d.lists.len()), (Code::Ok, 0), "{ua}");
    }
    // Addresses off the list meet their limit as usual.
    for ip in ["11.0.0.1", "2001:db9::1", "192.0.2.8"] {
        let d = l
            .decisions()
            .should_rate_limit(&req(&[("remote_address", ip)]))
            .await
            .unwrap();
        assert_eq!((d.overall, d.statuses[0].remaining), (Code::Ok, 1), "{ip}");
    }
}

async fn an_allow_list_lets_the_request_skip_every_limit(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    for _ in 0..5 {
        let d = l
            .decisions()
            .should_rate_limit(&req(&[("remote_address", "172.20.0.5"), ("user", "v")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(d.lists, [(ListAction::Allow, "internal".into())]);
        assert!(d.statuses.iter().all(|s| s.code == Code::Ok && s.limit.is_none()));
    }
    // Nothing was counted: the user's limit of 2 is untouched.
    let d = l.decisions().should_rate_limit(&req(&[("user", "v")])).await.unwrap();
    assert_eq!((d.overall, d.statuses[0].remaining), (Code::Ok, 1));
    // A deny list wins over an allow list: 10.9.9.9 is in both.
    let d = l
        .decisions()
        .should_rate_limit(&req(&[("remote_address", "10.9.9.9")]))
        .await
        .unwrap();
    assert_eq!(
        (d.overall, d.lists.clone()),
        (Code::OverLimit, vec![(ListAction::Deny, "blocked".into())])
    );
}

fn compile(dir: &Path) -> Result<RuleSet, ConfigError> {
    RuleSet::compile(&load(dir)?, &Metrics::discarded(0.8))
}

#[test]
fn a_list_file_next_to_the_configuration_is_read_and_read_again_on_reload() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "domain: edge\nlists:\n  - {name: blocked, key: ip, file: blocked.txt}\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    std::fs::write(dir.path().join("edge.yaml"), yaml).unwrap();
    std::fs::write(
        dir.path().join("blocked.txt"),
        "# bad actors\n10.0.0.0/8\n\n203.0.113.9  # one host\n",
    )
    .unwrap();
    let first = compile(dir.path()).unwrap();
    let lists = &first.domain("edge").unwrap().lists;
    let verdict = |entries: &[(&str, &str)]| {
        let entries: Vec<(String, String)> = entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        lists.verdict(&entries, None).map(|l| l.name.to_string())
    };
    assert_eq!(verdict(&[("ip", "10.2.3.4")]).as_deref(), Some("blocked"));
    assert_eq!(verdict(&[("ip", "203.0.113.9")]).as_deref(), Some("blocked"));
    assert_eq!(verdict(&[("ip", "203.0.113.10")]), None);
    // Another list file: the digest changes, so a reload swaps the rules in.
    std::fs::write(dir.path().join("blocked.txt"), "203.0.113.10\n").unwrap();
    let second = compile(dir.path()).unwrap();
    assert_ne!(first.digest(), second.digest());
    let entries = vec![("ip".to_string(), "203.0.113.10".to_string())];
    assert!(second.domain("edge").unwrap().lists.verdict(&entries, None).is_some());
    // A bad line names the file, the list and the line; a missing file names it.
    std::fs::write(dir.path().join("blocked.txt"), "10.0.0.0/8\n10.0.0.0/40\n").unwrap();
    let err = compile(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("edge.yaml': lists[0].file: 'blocked.txt' line 2: '10.0.0.0/40' is not a CIDR range"),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("blocked.txt")).unwrap();
    let err = compile(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("lists[0].file: cannot read '") && err.contains("blocked.txt'"),
        "{err}"
    );
    // A file over the bound is refused before it is read (a sparse file: its size is all that counts).
    let big = std::fs::File::create(dir.path().join("blocked.txt")).unwrap();
    big.set_len(sluice_core::config::MAX_LIST_FILE_BYTES + 1).unwrap();
    let err = compile(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("lists[0].file: '") && err.contains("more than the 67108864 a list file may have"),
        "{err}"
    );
}

#[test]
fn list_mistakes_name_file_and_path() {
    let metrics = Metrics::discarded(0.8);
    let cases = [
        (
            "{name: a, key: ip, values: ['10.0.0/8']}",
            "lists[0].values[0]: '10.0.0/8' is not a CIDR range",
        ),
        (
            "{name: a, key: ip, values: ['10.0.0.0/33']}",
            "lists[0].values[0]: '10.0.0.0/33' is not a CIDR range",
        ),
        (
            "{name: a, key: nope, values: []}",
            "lists[0].key: 'nope' is not a descriptor key of domain 'd'",
        ),
        (
            "{name: a, key: ip, action: block}",
            "lists[0].action: unknown action 'block' (expected deny or allow)",
        ),
        ("{key: ip}", "lists[0].name: a list needs a name"),
        (
            "{name: a, key: ip}, {name: a, key: ip}",
            "lists[1].name: duplicate list name 'a'",
        ),
        ("{name: a, key: ip, extra: 1}", "unknown field `extra`"),
    ];
    for (lists, want) in cases {
        let text = format!(
            "domain: d\nlists: [{lists}]\ndescriptors:\n  - key: ip\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        let err = sluice_core::config::parse(Path::new("lists.yaml"), &text)
            .and_then(|f| RuleSet::compile(&[f], &metrics).map(|_| ()))
            .expect_err(lists)
            .to_string();
        assert!(err.starts_with("config 'lists.yaml'"), "{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
    }
}

#[test]
fn the_summary_names_each_list() {
    let file = sluice_core::config::parse(Path::new("edge.yaml"), CONFIG).unwrap();
    let summary = RuleSet::compile(&[file], &Metrics::discarded(0.8)).unwrap().summary();
    for line in [
        "  list blocked: deny remote_address, 3 entries",
        "  list bots: deny user_agent, 2 entries",
        "  list internal: allow remote_address, 2 entries",
    ] {
        assert!(summary.contains(line), "{line} in {summary}");
    }
}

const MANAGED: &str = "
domain: edge
lists:
  - {name: blocked, key: remote_address, values: ['192.0.2.7']}
  - {name: partners, key: remote_address, action: allow}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
";

/// Waits (a bounded number of short real-time steps, no window waited out) until `done`.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) -> std::time::Duration {
    let start = std::time::Instant::now();
    while !done().await {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "{what}: not within 5 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    start.elapsed()
}

async fn entries_added_at_run_time_deny_at_once_and_expire_on_the_clock(store: impl Store) {
    let (l, clock) = limiter(MANAGED, store);
    tokio::spawn({
        let l = l.clone();
        async move { l.lists().keep().await }
    });
    let ip = |a: &str| req(&[("remote_address", a)]);
    let values = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        l.lists()
            .add_entries(
                "edge",
                "blocked",
                &values(&["203.0.113.0/24", "bad-actor"]),
                Some(60_000_000)
            )
            .await
            .unwrap(),
        2
    );
    l.lists()
        .add_entries("edge", "blocked", &values(&["2001:db8::/32"]), None)
        .await
        .unwrap();
    // In force on this instance as soon as the call returns.
    for a in ["203.0.113.9", "::ffff:203.0.113.9", "2001:db8::1", "192.0.2.7"] {
        let d = l.decisions().should_rate_limit(&ip(a)).await.unwrap();
        assert_eq!(
            (d.overall, d.lists.clone()),
            (Code::OverLimit, vec![(ListAction::Deny, "blocked".into())]),
            "{a}"
        );
    }
    let entries = l.lists().entries("edge", "blocked").await.unwrap();
    let shown: Vec<(&str, Option<u64>)> = entries.iter().map(|e| (e.value.as_str(), e.expires_us)).collect();
    let t = l.now_us() + 60_000_000;
    assert_eq!(
        shown,
        [
            ("2001:db8::/32", None),
            ("203.0.113.0/24", Some(t)),
            ("bad-actor", Some(t))
        ]
    );
    // An allow list managed at run time lets its caller skip the limits.
    l.lists()
        .add_entries("edge", "partners", &values(&["198.51.100.0/24"]), None)
        .await
        .unwrap();
    let d = l.decisions().should_rate_limit(&ip("198.51.100.20")).await.unwrap();
    assert_eq!(d.lists, [(ListAction::Allow, "partners".into())]);
    // The TTL runs on the limiter's clock: a minute later the entries are gone, the one without a TTL stays.
    clock.advance(61_000_000);
    until("the expired range is dropped", async || {
        l.decisions()
            .should_rate_limit(&ip("203.0.113.9"))
            .await
            .unwrap()
            .overall
            == Code::Ok
    })
    .await;
    assert_eq!(
        l.decisions()
            .should_rate_limit(&ip("2001:db8::1"))
            .await
            .unwrap()
            .overall,
        Code::OverLimit
    );
    assert_eq!(l.lists().entries("edge", "blocked").await.unwrap().len(), 1);
    // Removing takes run-time entries away; configured values stay.
    let removed = l
        .lists()
        .remove_entries("edge", "blocked", &values(&["2001:db8::/32", "192.0.2.7"]))
        .await
        .unwrap();
    assert_eq!(removed, 1, "only the run-time entry was there to remove");
    assert_eq!(
        l.decisions()
            .should_rate_limit(&ip("2001:db8::1"))
            .await
            .unwrap()
            .overall,
        Code::Ok
    );
    assert_eq!(
        l.decisions().should_rate_limit(&ip("192.0.2.7")).await.unwrap().overall,
        Code::OverLimit
    );
    // Bad input names what is wrong.
    let err = l
        .lists()
        .add_entries("edge", "blocked", &values(&["10.0.0.0/8", "10.0.0.0/99"]), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LimitError::InvalidArgument(m) if m.starts_with("values[1]: '10.0.0.0/99' is not a CIDR range")),
        "{err}"
    );
    let err = l
        .lists()
        .add_entries("edge", "nope", &values(&["x"]), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LimitError::NotFound(m) if m == "list: domain 'edge' has no list 'nope'"),
        "{err}"
    );
    let err = l.lists().entries("other", "blocked").await.unwrap_err();
    assert!(
        matches!(&err, LimitError::NotFound(m) if m.contains("no domain 'other'")),
        "{err}"
    );
    let err = l.lists().add_entries("edge", "blocked", &[], None).await.unwrap_err();
    assert!(
        matches!(&err, LimitError::InvalidArgument(m) if m == "values: none given"),
        "{err}"
    );
}

/// Two instances on one Redis: an entry added on one is in force on the other within a second, through the notice;
/// an instance whose user may not hear the notices still sees it within a second, by reading every second.
#[tokio::test]
async fn two_instances_on_one_redis_share_entries_within_a_second() {
    let redis = RedisServer::start();
    let mut rules = vec!["ACL".to_string(), "SETUSER".into(), "deaf".into()];
    rules.extend(
        readme_acl_user("test:")
            .into_iter()
            .skip(1)
            .filter(|r| r != "&sluice:notices"),
    );
    let args: Vec<&str> = rules.iter().map(String::as_str).collect();
    assert_eq!(redis.cli(&args).trim(), "OK");
    let deaf_url = redis
        .url()
        .replace("redis://", &format!("redis://deaf:{ACL_PASSWORD}@"));
    let (a, _) = limiter(MANAGED, redis_store(&redis.url()).await);
    let (b, _) = limiter(MANAGED, redis_store(&redis.url()).await);
    let (deaf, _) = limiter(MANAGED, redis_store(&deaf_url).await);
    for l in [&a, &b, &deaf] {
        tokio::spawn({
            let l = l.clone();
            async move { l.lists().keep().await }
        });
    }
    until("b hears the notices", async || b.store().hearing()).await;
    // Denied by the list (the address's own limit, which the polling below also counts, is not the question).
    let blocked = |l: &Arc<Limiter<RedisStore>>| {
        let l = l.clone();
        async move {
            let d = l
                .decisions()
                .should_rate_limit(&req(&[("remote_address", "203.0.113.5")]))
                .await
                .unwrap();
            d.lists == [(ListAction::Deny, "blocked".into())]
        }
    };
    assert!(!blocked(&b).await && !blocked(&deaf).await);
    a.lists()
        .add_entries("edge", "blocked", &["203.0.113.0/24".to_string()], None)
        .await
        .unwrap();
    let heard = until("b sees the entry", async || blocked(&b).await).await;
    let polled = until("the deaf instance sees the entry", async || blocked(&deaf).await).await;
    assert!(heard < std::time::Duration::from_secs(1), "{heard:?}");
    assert!(polled < std::time::Duration::from_millis(1_500), "{polled:?}");
    a.lists()
        .remove_entries("edge", "blocked", &["203.0.113.0/24".to_string()])
        .await
        .unwrap();
    let heard = until("b sees the removal", async || !blocked(&b).await).await;
    assert!(heard < std::time::Duration::from_secs(1), "{heard:?}");
    until("the deaf instance sees the removal", async || !blocked(&deaf).await).await;
}

/// The README's lists example is a configuration sluice reads (its file written beside it; a URL is fetched only when
/// a server starts).
#[test]
fn the_readme_lists_example_compiles() {
    let readme = include_str!("../../../README.md");
    let section = readme
        .split("## Lists, top offenders and waiting")
        .nth(1)
        .expect("the README's lists section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("its YAML example");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.yaml"), yaml).unwrap();
    std::fs::write(dir.path().join("blocked.txt"), "198.51.100.0/24\n").unwrap();
    let rules = compile(dir.path()).unwrap();
    let summary = rules.summary();
    assert!(
        summary.contains("list feed: deny remote_address, 0 entries + https://example.com/blocklist.txt every 3600s"),
        "{summary}"
    );
    assert!(
        summary.contains("list internal: allow remote_address, 1 entries"),
        "{summary}"
    );
}

/// A change written without its notice (its caller cancelled between the write and the announcement) is read by the
/// keeper's sweep within 30 seconds: no restart needed.
#[tokio::test(start_paused = true)]
async fn a_change_whose_notice_was_lost_is_read_within_the_sweep() {
    use sluice_core::store::{CounterKey, ListChange};
    let (l, _) = limiter(MANAGED, crate::harness::memory());
    tokio::spawn({
        let l = l.clone();
        async move { l.lists().keep().await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let denied = async || {
        let d = l
            .decisions()
            .should_rate_limit(&req(&[("remote_address", "203.0.113.5")]))
            .await
            .unwrap();
        d.lists == [(ListAction::Deny, "blocked".into())]
    };
    let values = ["203.0.113.0/24".to_string()];
    let change = ListChange::Add {
        values: &values,
        expires_us: None,
        max: 10,
    };
    let key = CounterKey::list("test:", "edge", "blocked");
    l.store().list_change(l.now_us(), &key, change).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    assert!(!denied().await, "no notice: not read yet");
    tokio::time::sleep(std::time::Duration::from_secs(21)).await;
    assert!(denied().await, "read by the sweep");
}
