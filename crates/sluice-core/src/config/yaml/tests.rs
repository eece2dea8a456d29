use super::*;
use crate::config::{RawDomain, parse};
use std::path::Path;

fn read(text: &str) -> Result<RawDomain, String> {
    match from_str::<RawDomain>(text) {
        Ok(Some(domain)) => Ok(domain),
        Ok(None) => Err("empty".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// What serde_yaml_ng, the loader this reader replaced, makes of the same text.
fn reference(text: &str) -> Result<RawDomain, String> {
    match serde_yaml_ng::from_str::<Option<RawDomain>>(text) {
        Ok(Some(domain)) => Ok(domain),
        Ok(None) => Err("empty".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn reads_as_the_previous_loader() {
    let documents = [
        "domain: d\n",
        "domain: d\ndescriptors:\n  - key: k\n    value: \"007\"\n  - key: k\n    value: 007\n  - key: k\n    value: true\n  - key: k\n    value: 1.5\n  - key: k\n    value: ~\n  - key: k\n    value: ''\n  - key: k\n    value: null\n  - key: k\n    value:\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0x10}\n  - key: l\n    rate_limit: {unit: Minute, requests_per_unit: +7, unlimited: False}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 007}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -5}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n",
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: 'true'\n",
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: TRUE\n    detailed_metric: True\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, colour: red}\n",
        "domain: d\ndescriptors:\n  - key: k\n    1: b\n",
        "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: a\n        metadata: {x: {2: y}}\n",
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {team: a, n: 3, f: 1.5, on: true, none: ~, list: [1, x, {y: z}], quoted: '3'}\n",
        "domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n",
        "domain: d\ndescriptors: {key: k}\n",
        "domain: [d]\n",
        "domain: 5\ndescriptors:\n",
        "domain: d\ndescriptors:\n  - key: k\n    descriptors: ~\n",
        "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\ndomain: d\nfailure_policy: fail_open\n",
        "domain: d\nquota_buckets:\n  - bucket: {a: b, c: ~}\n    rate_limit: {unit: second, requests_per_unit: 1}\n    assignment_ttl_seconds: 4\n",
        "domain: d\nquota_buckets:\n  - bucket: {a: [b]}\n",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, price: {a: 1, b: 2}, record: {key: u, size: 3}}\n",
        "---\ndomain: d\n...\n",
        "---\n",
        "",
        "# only a comment\n",
        "~\n",
        "[]\n",
        "5\n",
        "domain: d\n---\ndomain: e\n",
    ];
    for text in documents {
        let (ours, theirs) = (read(text), reference(text));
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "{text:?}"),
            // The same message, at times with a place where the previous loader gave none.
            (Err(a), Err(b)) => assert!(a == b || a.starts_with(&format!("{b} at line")), "{text:?}: {a} / {b}"),
            _ => panic!("{text:?}: {ours:?} but before {theirs:?}"),
        }
    }
}

#[test]
fn quoted_and_plain_scalars() {
    let d = read("domain: d\ndescriptors:\n  - key: k\n    value: \"007\"\n  - key: k\n    value: 007\n  - key: k\n    value: true\n  - key: k\n    value: 'null'\n  - key: k\n    value: null\n").unwrap();
    let values: Vec<_> = d.descriptors.iter().map(|d| d.value.as_deref()).collect();
    assert_eq!(values, [Some("007"), Some("007"), Some("true"), Some("null"), None]);
    let e = read("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n")
        .unwrap_err();
    assert_eq!(
        e,
        "descriptors[0].rate_limit.requests_per_unit: invalid type: string \"5\", expected u32 at line 4 column 51"
    );
    let e = read("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n").unwrap_err();
    assert!(
        e.starts_with("descriptors[0].shadow_mode: invalid type: string \"true\", expected a boolean"),
        "{e}"
    );
}

#[test]
fn anchors_and_aliases() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    value: &v one\n    rate_limit: &minute {unit: minute, requests_per_unit: &n 5}\n  - key: k\n    value: two\n    rate_limit: *minute\n  - key: *v\n    rate_limit: {unit: second, requests_per_unit: *n}\n    descriptors: &children\n      - key: a\n        rate_limit: *minute\n  - key: l\n    descriptors: *children\n";
    let d = read(text).unwrap();
    assert_eq!(format!("{d:?}"), format!("{:?}", reference(text).unwrap()));
    let limit = |i: usize| {
        d.descriptors[i]
            .rate_limit
            .as_deref()
            .map(|r| (r.unit.clone(), r.requests_per_unit))
    };
    assert_eq!(limit(0), limit(1));
    assert_eq!(&*d.descriptors[2].key, "one");
    assert_eq!(d.descriptors[2].rate_limit.as_ref().unwrap().requests_per_unit, 5);
    assert_eq!(&*d.descriptors[3].descriptors[0].key, "a");
    assert_eq!(
        limit(0),
        d.descriptors[3].descriptors[0]
            .rate_limit
            .as_deref()
            .map(|r| (r.unit.clone(), 5))
    );
    // An anchor redefined later names the later node from there on.
    let d = read(
        "domain: d\ndescriptors:\n  - {key: &k a}\n  - {key: *k, value: x}\n  - {key: &k b}\n  - {key: *k, value: y}\n",
    )
    .unwrap();
    let keys: Vec<_> = d.descriptors.iter().map(|d| &*d.key).collect();
    assert_eq!(keys, ["a", "a", "b", "b"]);
    // An alias inside its own anchor, or to no anchor, is refused.
    let e = read("domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n").unwrap_err();
    assert!(e.contains("anchor"), "{e}");
    let e = read("domain: d\ndescriptors: *nothing\n").unwrap_err();
    assert!(e.contains("line 2"), "{e}");
}

#[test]
fn alias_bombs_are_refused() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    let e = from_str::<serde_json::Value>(&text).unwrap_err().to_string();
    assert!(e.contains("repetition limit exceeded"), "{e}");
}

#[test]
fn deep_nesting_is_refused() {
    for text in ["[".repeat(100_000), "{a: ".repeat(100_000), "- ".repeat(10_000)] {
        let e = read(&text).unwrap_err();
        assert!(!e.is_empty());
    }
    let text = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {{a: {}1{}}}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    let e = read(&text).unwrap_err();
    assert!(e.contains("recursion limit exceeded"), "{e}");
    assert!(e.starts_with("descriptors[0].metadata.a"), "{e}");
}

#[test]
fn an_error_deep_in_a_large_file_names_its_path_and_line() {
    let mut text = String::from("domain: big\ndescriptors:\n");
    for i in 0..20_000 {
        let unit = if i == 17_345 { "fortnight: 1" } else { "unit: minute" };
        text.push_str(&format!(
            "  - key: tenant\n    value: t{i}\n    rate_limit:\n      {unit}\n      requests_per_unit: 10\n"
        ));
    }
    let e = parse(Path::new("big.yaml"), &text).unwrap_err().to_string();
    let line = 2 + 17_345 * 5 + 4;
    assert!(
        e.starts_with("config 'big.yaml': descriptors[17345].rate_limit: unknown field `fortnight`, expected one of"),
        "{e}"
    );
    assert!(e.ends_with(&format!("at line {line} column 7")), "{e}");
    assert_eq!(e, format!("config 'big.yaml': {}", reference(&text).unwrap_err()));
}

#[test]
fn metadata_keys_are_strings() {
    let e = read("domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [{true: 1}]}\n").unwrap_err();
    assert!(
        e.starts_with("descriptors[0].metadata.a[0]: key is not a string: true at line 4"),
        "{e}"
    );
    let e = read("domain: d\ndescriptors:\n  - key: k\n    metadata: {? [a] : 1}\n").unwrap_err();
    assert!(
        e.starts_with("descriptors[0].metadata: key is not a string: a sequence"),
        "{e}"
    );
    let d = read("domain: d\ndescriptors:\n  - key: k\n    metadata: {'1': one, \"true\": yes}\n").unwrap();
    let m = d.descriptors[0].metadata.as_deref().unwrap();
    assert_eq!(m["1"], "one");
    assert_eq!(m["true"], "yes");
}

#[test]
fn empty_files_and_documents() {
    for text in ["", "\n\n", "# comment\n", "---\n", "~\n", "null\n", "--- ~\n...\n"] {
        assert!(matches!(from_str::<RawDomain>(text), Ok(None)), "{text:?}");
    }
    let e = read("domain: d\n---\ndomain: e\n").unwrap_err();
    assert!(e.contains("more than one document"), "{e}");
    let e = read("domain: d\ndescriptors:\n  - key: k\n    key: l\n").unwrap_err();
    assert_eq!(e, "descriptors[0].key: duplicate field `key` at line 3 column 5");
}
