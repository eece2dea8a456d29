use super::*;
use crate::config::parse;

fn compile(texts: &[(&str, &str)]) -> Result<RuleSet, ConfigError> {
    let files: Result<Vec<_>, _> = texts.iter().map(|(n, t)| parse(Path::new(n), t)).collect();
    RuleSet::compile(&files?, &Metrics::discarded(0.8))
}

fn err(text: &str) -> String {
    compile(&[("d.yaml", text)]).unwrap_err().to_string()
}

#[test]
fn load_errors_name_file_and_path() {
    let cases = [
        ("descriptors: []\n", "'d.yaml': domain: domain is empty"),
        (
            "domain: d\ndescriptors: [{key: ''}]\n",
            "descriptors[0].key: descriptor key is empty",
        ),
        (
            "domain: d\ndescriptors: [{key: a, value: b}, {key: a, value: b}]\n",
            "descriptors[1]: duplicate descriptor 'd.a_b'",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n",
            "descriptors[0].rate_limit.unit: unknown unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unlimited: true, unit: second}}]\n",
            "descriptors[0].rate_limit.unit: a rule cannot be unlimited and have a unit",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unlimited: true, unit: bogus}}]\n",
            "descriptors[0].rate_limit.unit: unknown unit 'bogus'",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}}]\n",
            "descriptors[0].rate_limit.replaces[0].name: replaces entry is empty",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, name: x, replaces: [{name: x}]}}]\n",
            "replaces[0].name: a rule cannot replace itself",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}}]\n",
            "descriptors[0].rate_limit.algorithm: unknown algorithm 'magic'",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}}]\n",
            "descriptors[0].rate_limit.unit_multiplier: must be at least 1",
        ),
        (
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 1000}}]\n",
            "longer than 100 years",
        ),
        (
            "domain: d\ndescriptors: [{key: a, value: b, share_threshold: true}]\n",
            "descriptors[0].share_threshold",
        ),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text:?}: {e}");
        assert!(e.starts_with("config 'd.yaml': "), "{e}");
    }
}

#[test]
fn same_domain_in_two_files() {
    let e = compile(&[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("'b.yaml'") && e.contains("also defined in 'a.yaml'"), "{e}");
}
