//! What the service shows of decisions: the core's metrics as Prometheus text (per rule, without raw request
//! values unless a rule opts in; shadow-mode hits), and rule metadata as the response's `dynamic_metadata`.

use sluice::faces::headers::ResponseHeaders;
use sluice::limiter::{Decision, Descriptor, LimiterSettings, Request};
use sluice::store::Store;

use crate::harness::{limiter, limiter_with, memory};

fn desc(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Descriptor::default()
    }
}

fn req(domain: &str, descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn decide<S: Store>(l: &sluice::limiter::Limiter<S>, r: &Request) -> Decision {
    l.decisions().should_rate_limit(r).await.expect("decided")
}

#[tokio::test]
async fn metrics_count_hits_per_rule_without_raw_values() {
    let yaml = "
domain: m
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let (l, _) = limiter(yaml, memory());
    for _ in 0..5 {
        decide(&l, &req("m", vec![desc(&[("ip", "10.1.1.1")])])).await;
    }
    decide(&l, &req("m", vec![desc(&[("ip", "10.1.1.1")])])).await;
    decide(&l, &req("m", vec![desc(&[("user", "alice")])])).await;
    decide(&l, &req("other", vec![desc(&[("ip", "1")])])).await;
    let text = l.metrics().render();
    for line in [
        r#"sluice_rule_hits_total{domain="m",rule="m.ip"} 6"#,
        r#"sluice_rule_within_limit_total{domain="m",rule="m.ip"} 5"#,
        r#"sluice_rule_over_limit_total{domain="m",rule="m.ip"} 1"#,
        r#"sluice_rule_near_limit_total{domain="m",rule="m.ip"} 1"#,
        r#"sluice_rule_hits_total{domain="m",rule="m.user_alice"} 1"#,
        r#"sluice_requests_total{domain="m",rpc="should_rate_limit",result="ok"} 6"#,
        r#"sluice_requests_total{domain="m",rpc="should_rate_limit",result="over_limit"} 1"#,
        r#"sluice_requests_total{domain="(unknown)",rpc="should_rate_limit",result="ok"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    assert!(
        !text.contains("10.1.1.1"),
        "raw values stay out of labels unless opted in"
    );
    assert!(text.contains("sluice_store_call_duration_seconds_bucket"), "{text}");
}

#[tokio::test]
async fn shadow_mode_hits_are_counted() {
    let yaml = "
domain: edge
descriptors:
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let (l, _) = limiter(yaml, memory());
    decide(&l, &req("edge", vec![desc(&[("plan", "trial")])])).await;
    decide(&l, &req("edge", vec![desc(&[("plan", "trial")])])).await;
    let text = l.metrics().render();
    assert!(
        text.contains(r#"sluice_rule_shadow_mode_total{domain="edge",rule="edge.plan_trial"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn rule_metadata_becomes_dynamic_metadata() {
    let yaml = "
domain: md
descriptors:
  - key: a
    metadata: {team: payments, tier: 2, nested: {list: [1, x]}}
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let settings = LimiterSettings {
        response_metadata: true,
        ..LimiterSettings::default()
    };
    let (l, _) = limiter_with(yaml, memory(), settings);
    let d = decide(&l, &req("md", vec![desc(&[("a", "1")])])).await;
    let response = sluice::faces::wire::to_response(d, &ResponseHeaders::OFF);
    let fields = response.dynamic_metadata.expect("metadata set").fields;
    assert!(fields.contains_key("team") && fields.contains_key("tier") && fields.contains_key("nested"));
}

/// A rule's series appear once it is hit: a large configuration nobody has used yet scrapes small, and a reload
/// keeps the series (and counts) of the rules that survive it.
#[tokio::test]
async fn rule_series_appear_on_first_hit_and_survive_a_reload() {
    let mut yaml = String::from("domain: t\ndescriptors:\n");
    for i in 0..20_000 {
        yaml.push_str(&format!(
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: minute, requests_per_unit: 9}}\n"
        ));
    }
    let (l, _) = limiter(&yaml, memory());
    let untouched = l.metrics().render();
    assert!(untouched.len() < 100_000, "{} bytes before any hit", untouched.len());
    assert!(
        !untouched.contains("rule=\"t.tenant_"),
        "no rule's series before any hit"
    );
    decide(&l, &req("t", vec![desc(&[("tenant", "t7")])])).await;
    let hit = l.metrics().render();
    assert!(
        hit.contains(r#"sluice_rule_hits_total{domain="t",rule="t.tenant_t7"} 1"#),
        "{hit}"
    );
    assert_eq!(
        hit.matches("sluice_rule_hits_total{domain=\"t\",rule=\"t.tenant_")
            .count(),
        1,
        "only the rule hit"
    );
    // A reload to the same rules: t7's counter goes on from where it was.
    let metrics = l.metrics().clone();
    let file = sluice::config::parse(std::path::Path::new("t.yaml"), &yaml).unwrap();
    l.reload(sluice::rules::RuleSet::compile(&[file], &metrics).unwrap());
    decide(&l, &req("t", vec![desc(&[("tenant", "t7")])])).await;
    let after = l.metrics().render();
    assert!(
        after.contains(r#"sluice_rule_hits_total{domain="t",rule="t.tenant_t7"} 2"#),
        "{after}"
    );
}
