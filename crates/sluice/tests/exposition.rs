//! What the service shows of decisions: the core's metrics as Prometheus text (per rule, without raw request
//! values unless a rule opts in; shadow-mode hits), and rule metadata as the response's `dynamic_metadata`.

use sluice::headers::HeaderMode;
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
    l.should_rate_limit(r).await.expect("decided")
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
    let response = sluice::api::to_response(d, HeaderMode::Off);
    let fields = response.dynamic_metadata.expect("metadata set").fields;
    assert!(fields.contains_key("team") && fields.contains_key("tier") && fields.contains_key("nested"));
}
