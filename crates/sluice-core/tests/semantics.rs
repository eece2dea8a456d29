//! Envoy-compatible semantics (../shared/RLS-SEMANTICS.md), bullet by bullet, through the decision core over both
//! stores with an injected clock.

use sluice_core::limiter::{
    Code, Decision, Descriptor, LimitError, LimiterSettings, Override, Report, Request, Status,
};
use sluice_core::rules::Unit;
use sluice_core::store::Store;

use crate::harness::{T0, limiter, limiter_with};

const SECOND: u64 = 1_000_000;

const CONFIG: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 3, name: login}
  - key: path
    value: /api/*/items
    rate_limit: {unit: hour, requests_per_unit: 4, name: items}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 5, name: api}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 6, name: any-path}
  - key: tier
    value: internal
    rate_limit: {unlimited: true}
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: org
    value: acme
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: org
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: team
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: window
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 10, name: vip, replaces: [{name: per-user}]}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shared
    value: img-*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
";

fn desc(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Descriptor::default()
    }
}

fn req(domain: &str, descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

fn one(entries: &[(&str, &str)]) -> Request {
    req("edge", vec![desc(entries)])
}

async fn decide<S: Store>(l: &sluice_core::limiter::Limiter<S>, r: &Request) -> Decision {
    l.decisions().should_rate_limit(r).await.expect("decides")
}

fn limit_of(s: &Status) -> (u32, Unit, Option<String>) {
    let l = s.limit.as_ref().expect("a limit applied");
    (l.limit.requests, l.limit.unit, l.name.as_deref().map(str::to_string))
}

both_stores!(
    within_then_over_with_full_statuses,
    matching_order_wildcards_and_no_backtracking,
    unknown_domain_and_no_match_are_ok_without_limit,
    unlimited_reports_max_remaining,
    shadow_mode_reports_over_but_answers_ok,
    global_shadow_mode_keeps_statuses,
    replaces_drops_the_named_rule,
    hits_addend_request_and_descriptor_level,
    overrides_are_used_and_validated,
    windows_are_epoch_aligned_and_multiplied,
    quota_mode_decides_only_together,
    share_threshold_shares_one_counter,
    statuses_follow_request_order,
    invalid_requests_are_rejected,
    huge_hits_addend_neither_overflows_nor_panics,
    get_remaining_reports_and_consumes_nothing,
);

async fn within_then_over_with_full_statuses(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let r = one(&[("path", "/login")]);
    for remaining in [2, 1, 0] {
        let d = decide(&l, &r).await;
        assert_eq!(d.overall, Code::Ok);
        let s = &d.statuses[0];
        assert_eq!(s.code, Code::Ok);
        assert_eq!(limit_of(s), (3, Unit::Minute, Some("login".into())));
        assert_eq!(s.remaining, remaining);
        assert_eq!(s.reset_after_us, Some(50 * SECOND), "T0 is 10 s into its minute");
    }
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(d.statuses[0].code, Code::OverLimit);
    assert_eq!(d.statuses[0].remaining, 0);
    assert!(d.statuses[0].limit.is_some() && d.statuses[0].reset_after_us.is_some());
}

async fn matching_order_wildcards_and_no_backtracking(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let name = |d: Decision| {
        d.statuses[0]
            .limit
            .as_ref()
            .and_then(|l| l.name.as_deref().map(str::to_string))
    };
    assert_eq!(
        name(decide(&l, &one(&[("path", "/login")])).await).as_deref(),
        Some("login")
    );
    assert_eq!(
        name(decide(&l, &one(&[("path", "/api/v1/items")])).await).as_deref(),
        Some("items"),
        "first wildcard in config order"
    );
    assert_eq!(
        name(decide(&l, &one(&[("path", "/api/v1/users")])).await).as_deref(),
        Some("api")
    );
    assert_eq!(
        name(decide(&l, &one(&[("path", "/other")])).await).as_deref(),
        Some("any-path")
    );
    // org=acme has no rule of its own; its child needs `user`.
    let d = decide(&l, &one(&[("org", "acme")])).await;
    assert!(d.statuses[0].limit.is_none());
    let d = decide(&l, &one(&[("org", "acme"), ("user", "u")])).await;
    assert_eq!(d.statuses[0].limit.as_ref().unwrap().limit.requests, 1);
    // No backtracking: org=acme dead-ends at `team`; the key-only `org` branch (which has `team`) is not retried.
    let d = decide(&l, &one(&[("org", "acme"), ("team", "t")])).await;
    assert!(d.statuses[0].limit.is_none());
    let d = decide(&l, &one(&[("org", "other"), ("team", "t")])).await;
    assert_eq!(d.statuses[0].limit.as_ref().unwrap().limit.requests, 1);
    // A request deeper than the tree has no rule.
    let d = decide(&l, &one(&[("path", "/login"), ("extra", "x")])).await;
    assert!(d.statuses[0].limit.is_none());
}

async fn unknown_domain_and_no_match_are_ok_without_limit(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    for r in [req("nope", vec![desc(&[("path", "/login")])]), one(&[("unknown", "x")])] {
        let d = decide(&l, &r).await;
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(
            d.statuses,
            vec![Status {
                code: Code::Ok,
                limit: None,
                remaining: 0,
                reset_after_us: None
            }]
        );
    }
}

async fn unlimited_reports_max_remaining(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    for _ in 0..5 {
        let d = decide(&l, &one(&[("tier", "internal")])).await;
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(d.statuses[0].remaining, u32::MAX);
        assert!(d.statuses[0].limit.is_none() && d.statuses[0].reset_after_us.is_none());
    }
}

async fn shadow_mode_reports_over_but_answers_ok(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    decide(&l, &one(&[("plan", "trial")])).await;
    let d = decide(&l, &one(&[("plan", "trial")])).await;
    assert_eq!(d.overall, Code::Ok);
    assert_eq!(d.statuses[0].code, Code::Ok);
    assert_eq!(d.statuses[0].remaining, 0);
    assert!(d.statuses[0].limit.is_some());
}

async fn global_shadow_mode_keeps_statuses(store: impl Store) {
    let settings = LimiterSettings {
        shadow_mode: true,
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(CONFIG, store, settings);
    let r = one(&[("remote_address", "1.2.3.4")]);
    decide(&l, &r).await;
    decide(&l, &r).await;
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::Ok);
    assert_eq!(d.statuses[0].code, Code::OverLimit);
}

async fn replaces_drops_the_named_rule(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let both = req("edge", vec![desc(&[("user", "u1")]), desc(&[("vip", "yes")])]);
    for _ in 0..4 {
        let d = decide(&l, &both).await;
        assert_eq!(d.overall, Code::Ok, "per-user (2/min) is replaced by vip (10/min)");
        assert!(
            d.statuses[0].limit.is_none(),
            "a replaced rule is neither counted nor reported"
        );
        assert_eq!(d.statuses[0].remaining, 0);
        assert_eq!(limit_of(&d.statuses[1]).2.as_deref(), Some("vip"));
    }
    // Not replaced on its own, and nothing was counted while it was replaced.
    let d = decide(&l, &one(&[("user", "u1")])).await;
    assert_eq!(d.statuses[0].remaining, 1);
}

async fn hits_addend_request_and_descriptor_level(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let mut r = one(&[("path", "/other")]); // 6 per day
    r.hits_addend = 4;
    assert_eq!(decide(&l, &r).await.statuses[0].remaining, 2);
    // A descriptor's own hits_addend wins; 0 checks without consuming.
    r.descriptors[0].hits_addend = Some(0);
    for _ in 0..3 {
        let d = decide(&l, &r).await;
        assert_eq!((d.overall, d.statuses[0].remaining), (Code::Ok, 2));
    }
    r.descriptors[0].hits_addend = Some(3);
    let d = decide(&l, &r).await;
    assert_eq!((d.overall, d.statuses[0].remaining), (Code::OverLimit, 0));
    // Request-level 0 means 1.
    let mut r = one(&[("path", "/login")]);
    r.hits_addend = 0;
    assert_eq!(decide(&l, &r).await.statuses[0].remaining, 2);
}

async fn overrides_are_used_and_validated(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let mut d = desc(&[("anything", "x")]);
    d.limit_override = Some(Override {
        requests_per_unit: 1,
        unit: 4, // DAY
    });
    let r = req("edge", vec![d.clone()]);
    let first = decide(&l, &r).await;
    assert_eq!(first.overall, Code::Ok);
    assert_eq!(limit_of(&first.statuses[0]), (1, Unit::Day, None));
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    // An override needs an existing domain.
    let d2 = decide(&l, &req("nope", vec![d.clone()])).await;
    assert!(d2.statuses[0].limit.is_none());
    for unit in [0, 7, -1] {
        d.limit_override = Some(Override {
            requests_per_unit: 0,
            unit,
        });
        let e = l
            .decisions()
            .should_rate_limit(&req("edge", vec![d.clone()]))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, LimitError::InvalidArgument(m) if m.contains("descriptors[0].limit.unit")),
            "{e}"
        );
    }
}

async fn windows_are_epoch_aligned_and_multiplied(store: impl Store) {
    let (l, clock) = limiter(CONFIG, store);
    let r = one(&[("window", "w")]); // 1 per 30 s
    let d = decide(&l, &r).await;
    assert_eq!(
        d.statuses[0].reset_after_us,
        Some(20 * SECOND),
        "T0 is 10 s into its 30 s window"
    );
    clock.advance(19 * SECOND);
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    clock.advance(SECOND);
    let d = decide(&l, &r).await;
    assert_eq!(d.overall, Code::Ok, "the next aligned window began");
    assert_eq!(d.statuses[0].reset_after_us, Some(30 * SECOND));
    // 2 per second: a new second resets.
    let r = one(&[("remote_address", "10.0.0.1")]);
    for _ in 0..2 {
        assert_eq!(decide(&l, &r).await.overall, Code::Ok);
    }
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    clock.advance(SECOND);
    assert_eq!(decide(&l, &r).await.overall, Code::Ok);
}

async fn quota_mode_decides_only_together(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let first = req("edge", vec![desc(&[("quota1", "a")]), desc(&[("path", "/other")])]);
    assert_eq!(decide(&l, &first).await.overall, Code::Ok);
    // quota1 is over but quota2 is not: quota1's status says OVER_LIMIT, the request passes.
    let both = req(
        "edge",
        vec![
            desc(&[("quota1", "a")]),
            desc(&[("quota2", "b")]),
            desc(&[("path", "/other")]),
        ],
    );
    let d = decide(&l, &both).await;
    assert_eq!((d.statuses[0].code, d.statuses[1].code), (Code::OverLimit, Code::Ok));
    assert_eq!(d.overall, Code::Ok);
    // Every quota descriptor over: the request is over.
    let d = decide(&l, &both).await;
    assert_eq!(
        (d.statuses[0].code, d.statuses[1].code),
        (Code::OverLimit, Code::OverLimit)
    );
    assert_eq!(d.overall, Code::OverLimit);
    // A non-quota descriptor over decides alone.
    let mut over = req("edge", vec![desc(&[("quota1", "fresh")]), desc(&[("path", "/login")])]);
    over.descriptors[1].hits_addend = Some(4);
    assert_eq!(decide(&l, &over).await.overall, Code::OverLimit);
}

async fn share_threshold_shares_one_counter(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    assert_eq!(decide(&l, &one(&[("shared", "img-1")])).await.statuses[0].remaining, 1);
    assert_eq!(decide(&l, &one(&[("shared", "img-2")])).await.statuses[0].remaining, 0);
    assert_eq!(decide(&l, &one(&[("shared", "img-3")])).await.overall, Code::OverLimit);
    // Without share_threshold every value has its own counter.
    assert_eq!(
        decide(&l, &one(&[("remote_address", "a")])).await.statuses[0].remaining,
        1
    );
    assert_eq!(
        decide(&l, &one(&[("remote_address", "b")])).await.statuses[0].remaining,
        1
    );
}

async fn statuses_follow_request_order(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let r = req(
        "edge",
        vec![
            desc(&[("tier", "internal")]),
            desc(&[("unknown", "x")]),
            desc(&[("path", "/login")]),
            desc(&[("plan", "trial")]),
        ],
    );
    let d = decide(&l, &r).await;
    assert_eq!(d.statuses.len(), 4);
    assert_eq!(d.statuses[0].remaining, u32::MAX);
    assert!(d.statuses[1].limit.is_none());
    assert_eq!(limit_of(&d.statuses[2]).2.as_deref(), Some("login"));
    assert_eq!(limit_of(&d.statuses[3]).0, 1);
}

async fn invalid_requests_are_rejected(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let cases = [
        (req("", vec![desc(&[("a", "b")])]), "domain is empty"),
        (req("edge", vec![]), "no descriptors"),
        (
            req("edge", vec![desc(&[("a", "b")]), desc(&[])]),
            "descriptors[1] has no entries",
        ),
        (
            req("edge", vec![desc(&[("a", "b"), ("", "c")])]),
            "descriptors[0].entries[1].key is empty",
        ),
    ];
    for (r, want) in cases {
        match l.decisions().should_rate_limit(&r).await {
            Err(LimitError::InvalidArgument(m)) => assert_eq!(m, want),
            other => panic!("{want}: {other:?}"),
        }
        assert!(matches!(
            l.decisions().get_remaining(&r, 1).await,
            Err(LimitError::InvalidArgument(_))
        ));
    }
}

async fn huge_hits_addend_neither_overflows_nor_panics(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let mut r = one(&[("path", "/other")]);
    r.descriptors[0].hits_addend = Some(u64::MAX);
    for _ in 0..3 {
        let d = decide(&l, &r).await;
        assert_eq!((d.overall, d.statuses[0].remaining), (Code::OverLimit, 0));
    }
    r.hits_addend = u32::MAX;
    r.descriptors[0].hits_addend = None;
    assert_eq!(decide(&l, &r).await.overall, Code::OverLimit);
    let reports = l
        .decisions()
        .get_remaining(&one(&[("path", "/other")]), u64::MAX)
        .await
        .unwrap();
    assert!(matches!(
        &reports[0],
        Report::Limited {
            retry_after_us: None,
            ..
        }
    ));
}

async fn get_remaining_reports_and_consumes_nothing(store: impl Store) {
    let (l, _) = limiter(CONFIG, store);
    let r = req(
        "edge",
        vec![
            desc(&[("path", "/login")]),
            desc(&[("tier", "internal")]),
            desc(&[("x", "y")]),
        ],
    );
    let login = |reports: &[Report]| match &reports[0] {
        Report::Limited {
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
            ..
        } => (
            limit.limit.requests,
            limit.name.as_deref().map(str::to_string),
            *remaining,
            *reset_after_us,
            *retry_after_us,
        ),
        other => panic!("{other:?}"),
    };
    for _ in 0..3 {
        let reports = l.decisions().get_remaining(&r, 1).await.unwrap();
        assert_eq!(login(&reports), (3, Some("login".into()), 3, 50 * SECOND, Some(0)));
        assert_eq!(reports[1], Report::Unlimited);
        assert_eq!(reports[2], Report::NoRule);
    }
    for _ in 0..3 {
        decide(&l, &one(&[("path", "/login")])).await;
    }
    let reports = l.decisions().get_remaining(&r, 1).await.unwrap();
    assert_eq!(login(&reports).2, 0);
    assert_eq!(login(&reports).4, Some(50 * SECOND));
    let reports = l.decisions().get_remaining(&r, 4).await.unwrap();
    assert_eq!(login(&reports).4, None, "a cost above the limit never fits");
}

#[tokio::test]
async fn response_metadata_merges_passing_rules() {
    let yaml = "
domain: md
descriptors:
  - key: a
    metadata: {team: payments, tier: 2}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    metadata: {other: true}
    rate_limit: {unit: minute, requests_per_unit: 0}
";
    let settings = LimiterSettings {
        response_metadata: true,
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(yaml, crate::harness::memory(), settings);
    let d = decide(&l, &req("md", vec![desc(&[("a", "1")]), desc(&[("b", "1")])])).await;
    assert_eq!(d.metadata.len(), 1, "only the passing rule's metadata");
    let fields = &d.metadata[0];
    assert_eq!(fields.get("team"), Some(&serde_json::json!("payments")));
    assert_eq!(fields.get("tier"), Some(&serde_json::json!(2)));
    assert!(!fields.contains_key("other"));
    assert_eq!(T0 % 1_000_000, 0);
}
