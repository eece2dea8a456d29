//! The reference's own test configurations (`tests/reference/`, see its ORIGIN.md), loaded as its
//! `config_test.go` loads them: the good files compile to the limits it expects, the bad ones are rejected naming
//! the file and the path inside it, and files of one domain merge only when asked to.

use std::path::PathBuf;

use sluice_core::config::{self, ConfigError, ConfigFile};
use sluice_core::metrics::Metrics;
use sluice_core::rules::{Domains, RuleSet, Unit};

fn file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(name)
}

fn load(names: &[&str]) -> Result<Vec<ConfigFile>, ConfigError> {
    names.iter().map(|n| config::load_file(&file(n))).collect()
}

fn compile(names: &[&str], domains: Domains) -> Result<RuleSet, String> {
    load(names)
        .and_then(|files| RuleSet::compile_with(&files, &Metrics::discarded(0.8), domains))
        .map_err(|e| e.to_string())
}

/// The limit (requests, unit) of the rule `entries` match in `test-domain`.
fn limit(rules: &RuleSet, entries: &[(&str, &str)]) -> Option<(u32, Unit)> {
    let m = rules.domain("test-domain")?.find(entries)?;
    m.rule.tiers.first().map(|t| (t.limit.requests, t.limit.unit))
}

#[test]
fn good_files_load() {
    for name in [
        "basic_config.yaml",
        "metadata.yaml",
        "shadowmode_config.yaml",
        "share_threshold.yaml",
        "wildcard.yaml",
        "merge_domain_key1.yaml",
        "merge_domain_key2.yaml",
    ] {
        let rules = compile(&[name], Domains::OnePerFile).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(rules.domain("test-domain").is_some(), "{name}");
    }
    let basic = compile(&["basic_config.yaml"], Domains::OnePerFile).unwrap();
    assert_eq!(
        limit(&basic, &[("key1", "value1"), ("subkey1", "x")]),
        Some((5, Unit::Second))
    );
    assert_eq!(limit(&basic, &[("key1", "value1")]), None);
}

#[test]
fn bad_files_are_rejected_naming_file_and_path() {
    let cases = [
        ("empty_domain.yaml", "domain: domain is empty"),
        ("empty_key.yaml", "descriptors[0].key: descriptor key is empty"),
        (
            "duplicate_key.yaml",
            "descriptors[1]: duplicate descriptor 'test-domain.key1_value1'",
        ),
        (
            "bad_limit_unit.yaml",
            "descriptors[0].rate_limit.unit: unknown unit 'foo'",
        ),
        ("replaces_self.yaml", "a rule cannot replace itself ('self')"),
        ("replaces_empty.yaml", "replaces[0].name: replaces entry is empty"),
        ("bad_yaml.yaml", ""),
        ("misspelled_key.yaml", "unknown field `ratelimit`"),
        ("misspelled_key2.yaml", "unknown field `requestsperunit`"),
        ("non_string_key.yaml", "0.25"),
        ("non_map_list.yaml", "descriptors[0]"),
        ("unlimited_with_unit.yaml", "unit"),
    ];
    for (name, want) in cases {
        let e = compile(&[name], Domains::OnePerFile).expect_err(name);
        let path = file(name);
        assert!(e.starts_with(&format!("config '{}'", path.display())), "{name}: {e}");
        assert!(e.contains(want), "{name}: {e}");
    }
}

#[test]
fn a_domain_in_two_files_is_an_error_naming_both_unless_merged() {
    let e = compile(&["basic_config.yaml", "duplicate_domain.yaml"], Domains::OnePerFile).unwrap_err();
    assert!(
        e.contains("duplicate_domain.yaml") && e.contains("also defined in"),
        "{e}"
    );
    assert!(e.contains("basic_config.yaml"), "{e}");

    let two = ["merge_domain_key1.yaml", "merge_domain_key2.yaml"];
    assert!(compile(&two, Domains::OnePerFile).is_err());
    let merged = compile(&two, Domains::Merged).unwrap();
    assert_eq!(limit(&merged, &[("key1", "value1")]), Some((10, Unit::Minute)));
    assert_eq!(limit(&merged, &[("key2", "value2")]), Some((20, Unit::Minute)));
    assert!(merged.domain("foo_domain").is_none());
}

#[test]
fn merging_rejects_a_key_defined_twice() {
    // The same file twice, as the reference's TestDuplicateKeyDomainMerge does.
    let e = compile(&["merge_domain_key1.yaml", "merge_domain_key1.yaml"], Domains::Merged).unwrap_err();
    assert!(
        e.contains("merge_domain_key1.yaml") && e.contains("'test-domain.key1_value1'"),
        "{e}"
    );

    // Two files defining one top-level descriptor: the error names both.
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    std::fs::write(
        &a,
        "domain: d\ndescriptors:\n  - {key: k, value: v, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    )
    .unwrap();
    std::fs::write(&b, "domain: d\ndescriptors:\n  - {key: other}\n  - {key: k, value: v, rate_limit: {unit: hour, requests_per_unit: 2}}\n").unwrap();
    let files = config::load(dir.path()).unwrap();
    let e = RuleSet::compile_with(&files, &Metrics::discarded(0.8), Domains::Merged)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!("config '{}': descriptors[1]", b.display())),
        "{e}"
    );
    assert!(
        e.contains("duplicate descriptor 'd.k_v'") && e.contains(&format!("also defined in '{}'", a.display())),
        "{e}"
    );

    // Conflicting failure policies are an error too; one file's policy holds for the merged domain.
    std::fs::write(&a, "domain: d\nfailure_policy: fail_open\n").unwrap();
    std::fs::write(&b, "domain: d\nfailure_policy: fail_closed\n").unwrap();
    let files = config::load(dir.path()).unwrap();
    let e = RuleSet::compile_with(&files, &Metrics::discarded(0.8), Domains::Merged)
        .unwrap_err()
        .to_string();
    assert!(e.contains("failure_policy") && e.contains("a.yaml"), "{e}");
}
