//! The xDS client's tests: the settings' parsers, the conversion of `RateLimitConfig` resources, and a management
//! server played by the test on a free port.
use std::path::Path;

use prost_types::value::Kind;

use super::*;
use crate::clock::SystemClock;
use crate::limiter::LimiterSettings;
use crate::metrics::Metrics;
use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;
use crate::store::memory::MemoryStore;

fn limit(unit: RateLimitUnit, requests: u32, name: &str) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit: requests,
        name: name.to_string(),
        ..RateLimitPolicy::default()
    })
}

fn node(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.to_string(),
        value: value.to_string(),
        rate_limit,
        ..RateLimitDescriptor::default()
    }
}

fn resource(config: &RateLimitConfig) -> prost_types::Any {
    prost_types::Any {
        type_url: TYPE_URL.to_string(),
        value: config.encode_to_vec(),
    }
}

fn response(version: &str, nonce: &str, configs: &[RateLimitConfig]) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_string(),
        resources: configs.iter().map(resource).collect(),
        type_url: TYPE_URL.to_string(),
        nonce: nonce.to_string(),
        ..DiscoveryResponse::default()
    }
}

fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitConfig {
    RateLimitConfig {
        name: name.to_string(),
        domain: domain.to_string(),
        descriptors,
    }
}

fn discarded() -> Metrics {
    Metrics::discarded(0.8)
}

#[test]
fn units_are_spelled_as_in_yaml_and_unknown_is_none() {
    let units = [
        (RateLimitUnit::Second, "second"),
        (RateLimitUnit::Minute, "minute"),
        (RateLimitUnit::Hour, "hour"),
        (RateLimitUnit::Day, "day"),
        (RateLimitUnit::Week, "week"),
        (RateLimitUnit::Month, "month"),
        (RateLimitUnit::Year, "year"),
    ];
    for (unit, name) in units {
        let c = config("r", "d", vec![node("k", "", limit(unit, 1, ""))]);
        let file = config_file(&c, 0, 0).unwrap();
        let rl = file.domain.descriptors[0].rate_limit.as_ref().unwrap();
        assert_eq!(rl.unit.as_deref(), Some(name));
    }
    let unlimited = RateLimitPolicy {
        unlimited: true,
        ..RateLimitPolicy::default()
    };
    let c = config("r", "d", vec![node("k", "", Some(unlimited))]);
    let file = config_file(&c, 0, 0).unwrap();
    assert_eq!(file.domain.descriptors[0].rate_limit.as_ref().unwrap().unit, None);
    // An unlimited rule with UNKNOWN compiles, as in the reference.
    RuleSet::compile(&[file], &discarded()).unwrap();
}

#[test]
fn a_snapshot_means_what_the_same_yaml_means() {
    let mut metadata = prost_types::Struct::default();
    let string = |s: &str| prost_types::Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    metadata.fields.insert("team".into(), string("payments"));
    metadata.fields.insert(
        "tags".into(),
        prost_types::Value {
            kind: Some(Kind::ListValue(prost_types::ListValue {
                values: vec![
                    string("a"),
                    prost_types::Value {
                        kind: Some(Kind::BoolValue(true)),
                    },
                    prost_types::Value {
                        kind: Some(Kind::NumberValue(1.5)),
                    },
                ],
            })),
        },
    );
    let mut nested = node("path", "/api/*", limit(RateLimitUnit::Day, 4, ""));
    nested.descriptors = vec![node("user", "", limit(RateLimitUnit::Hour, 2, "api-user"))];
    nested.quota_mode = true;
    let mut region = node("region", "", limit(RateLimitUnit::Day, 10, "region"));
    if let Some(rl) = region.rate_limit.as_mut() {
        rl.replaces = vec![RateLimitReplace { name: "team".into() }];
    }
    let mut team = node("team", "", limit(RateLimitUnit::Day, 1, "team"));
    team.shadow_mode = true;
    team.detailed_metric = true;
    team.metadata = Some(metadata);
    let c = config("edge-policy", "edge", vec![nested, team, region]);
    let file = config_file(&c, 0, 7).unwrap();
    assert_eq!(file.path, Path::new("xds:edge-policy"));
    assert_eq!(file.digest, 7);

    let yaml = "domain: edge
descriptors:
  - key: path
    value: /api/*
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 4}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 2, name: api-user}
  - key: team
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1, name: team}
    metadata: {tags: [a, true, 1.5], team: payments}
  - key: region
    rate_limit: {unit: day, requests_per_unit: 10, name: region, replaces: [{name: team}]}
";
    let parsed = crate::config::parse(Path::new("xds:edge-policy"), yaml).unwrap();
    assert_eq!(format!("{:?}", file.domain), format!("{:?}", parsed.domain));
    let from_xds = RuleSet::compile(&[file], &discarded()).unwrap();
    let from_yaml = RuleSet::compile(&[parsed], &discarded()).unwrap();
    assert_eq!(from_xds.summary(), from_yaml.summary());
}

#[test]
fn errors_name_the_resource_and_the_path() {
    let bad = config(
        "edge-policy",
        "edge",
        vec![node("a", "", None), node("b", "", limit(RateLimitUnit::Unknown, 5, ""))],
    );
    let e = snapshot(&response("1", "n", &[bad]), &discarded(), Domains::OnePerFile)
        .unwrap_err()
        .to_string();
    assert!(e.contains("'xds:edge-policy'"), "{e}");
    assert!(e.contains("descriptors[1].rate_limit.unit"), "{e}");

    let mut weird = config("w", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]);
    weird.descriptors[0].rate_limit.as_mut().unwrap().unit = 42;
    let e = config_file(&weird, 0, 0).unwrap_err().to_string();
    assert_eq!(
        e,
        "config 'xds:w': descriptors[0].rate_limit.unit: unknown unit number 42"
    );

    let twice = [
        config("one", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]),
        config("two", "d", vec![node("b", "", limit(RateLimitUnit::Day, 1, ""))]),
    ];
    let e = snapshot(&response("1", "n", &twice), &discarded(), Domains::OnePerFile)
        .unwrap_err()
        .to_string();
    assert!(e.contains("xds:two") && e.contains("xds:one"), "{e}");
    snapshot(&response("1", "n", &twice), &discarded(), Domains::Merged).unwrap();

    let unnamed = config("", "", vec![]);
    let e = snapshot(&response("1", "n", &[unnamed]), &discarded(), Domains::OnePerFile)
        .unwrap_err()
        .to_string();
    assert!(e.contains("'xds:resources[0]'"), "{e}");
}

#[test]
fn what_the_network_may_send_is_rejected_not_trusted() {
    let good = config("r", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]);
    let m = discarded();
    let reject = |r: &DiscoveryResponse| snapshot(r, &m, Domains::OnePerFile).unwrap_err().to_string();

    let mut wrong = response("1", "n", std::slice::from_ref(&good));
    wrong.type_url = "type.googleapis.com/envoy.config.cluster.v3.Cluster".into();
    assert!(reject(&wrong).contains("envoy.config.cluster.v3.Cluster"));

    let empty = snapshot(&response("1", "n", &[]), &m, Domains::OnePerFile).unwrap();
    assert!(empty.domain("d").is_none());

    let mut other = response("1", "n", std::slice::from_ref(&good));
    other.resources[0].type_url = "type.googleapis.com/google.protobuf.Empty".into();
    assert!(reject(&other).starts_with("resources[0]: type_url"));

    let mut garbage = response("1", "n", std::slice::from_ref(&good));
    garbage.resources[0].value = vec![0xff, 0xff, 0xff];
    assert!(reject(&garbage).starts_with("resources[0]: cannot decode"));
}

fn client() -> Client<MemoryStore> {
    let limiter = Limiter::new(
        RuleSet::compile(&[], &discarded()).unwrap(),
        MemoryStore::new(),
        Arc::new(SystemClock),
        discarded(),
        LimiterSettings::default(),
    );
    let settings = XdsSettings {
        server: "http://127.0.0.1:1".parse().unwrap(),
        node_id: "n".into(),
        node_metadata: NodeMetadata::default(),
        headers: Vec::new(),
        tls: XdsTls::default(),
        backoff: Backoff::default(),
        max_message_bytes: 1 << 20,
    };
    Client {
        limiter: Arc::new(limiter),
        domains: Domains::OnePerFile,
        node: node_of(&settings),
        settings,
        version: String::new(),
        applied: watch::channel(false).0,
    }
}

fn node_of(settings: &XdsSettings) -> Node {
    super::node(settings)
}

#[test]
fn a_good_snapshot_is_applied_and_acked_a_bad_one_nacked_with_the_last_version() {
    let mut c = client();
    let good = config("r", "d", vec![node("a", "", limit(RateLimitUnit::Day, 1, ""))]);
    let ack = c.answer(response("v1", "n1", &[good]));
    assert_eq!((ack.version_info.as_str(), ack.response_nonce.as_str()), ("v1", "n1"));
    assert!(ack.error_detail.is_none());
    assert!(*c.applied.borrow());
    let in_force = c.limiter.rules().digest();

    let bad = config("broken", "d", vec![node("", "", None)]);
    let nack = c.answer(response("v2", "n2", &[bad]));
    assert_eq!((nack.version_info.as_str(), nack.response_nonce.as_str()), ("v1", "n2"));
    let status = nack.error_detail.unwrap();
    assert_eq!(status.code, INVALID_ARGUMENT);
    assert!(status.message.contains("xds:broken"), "{}", status.message);
    assert_eq!(c.limiter.rules().digest(), in_force);
    assert_eq!(c.version, "v1");
}

#[test]
fn backoff_doubles_up_to_the_max_within_the_random_factor() {
    let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1_000), 0.5);
    let ms = |attempt, unit| b.delay(attempt, unit).as_millis();
    assert_eq!(
        [ms(0, 0.0), ms(1, 0.0), ms(2, 0.0), ms(3, 0.0), ms(4, 0.0)],
        [100, 200, 400, 800, 1_000]
    );
    assert_eq!((ms(0, -1.0), ms(0, 1.0)), (50, 150));
    assert_eq!(ms(10, 1.0), 1_000);
    assert_eq!(ms(u32::MAX, -1.0), 500);
    // A max below the initial delay is the initial delay.
    let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(10), 0.0);
    assert_eq!(b.delay(5, 0.0), Duration::from_millis(100));
    for _ in 0..100 {
        assert!((-1.0..=1.0).contains(&jitter()));
    }
}

#[test]
fn settings_are_parsed_and_bad_ones_named() {
    let meta: NodeMetadata = "k1:v1, k2=v2,,url=http://x:1".parse().unwrap();
    let pairs = [("k1", "v1"), ("k2", "v2"), ("url", "http://x:1")];
    assert_eq!(meta.0, pairs.map(|(k, v)| (k.to_string(), v.to_string())));
    assert_eq!("".parse::<NodeMetadata>().unwrap(), NodeMetadata::default());
    assert_eq!(
        "a=1,b".parse::<NodeMetadata>().unwrap_err().to_string(),
        "'b': expected key:value or key=value"
    );

    let h: Header = "X-Tenant: blue".parse().unwrap();
    assert_eq!((h.name.as_str(), h.value.to_str().unwrap()), ("x-tenant", "blue"));
    assert!("novalue".parse::<Header>().is_err());
    assert!("bad name:v".parse::<Header>().is_err());

    assert!("https://xds.example:443".parse::<ServerUrl>().unwrap().is_tls());
    assert!(!"http://127.0.0.1:18000".parse::<ServerUrl>().unwrap().is_tls());
    for bad in ["127.0.0.1:18000", "grpc://x:1", "http://x:1/path", "http://"] {
        assert!(bad.parse::<ServerUrl>().is_err(), "{bad}");
    }
}

#[tokio::test]
async fn tls_options_need_https_and_readable_files() {
    let mut settings = client().settings;
    settings.tls.san = Some("xds.internal".into());
    let e = endpoint(&settings).unwrap_err().to_string();
    assert_eq!(e, "xds: --xds-tls-san needs an https:// --xds-server");
    settings.server = "https://127.0.0.1:1".parse().unwrap();
    settings.tls.ca = Some("/nonexistent/ca.pem".into());
    let e = endpoint(&settings).unwrap_err().to_string();
    assert!(
        e.starts_with("xds: cannot read --xds-tls-ca '/nonexistent/ca.pem'"),
        "{e}"
    );
}
