//! `sluice simulate`, the binary, on the example of `deploy/simulate/`: the write-up's four strategies on one bursty
//! trace, the report and its CSV (the copy in `docs/simulate/` up to date); mistakes refused before anything runs, naming the flag, file, line or field.

use std::path::Path;
use std::process::Command;

fn simulate(args: &[&str], out: &Path) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .args(args)
        .arg("--out")
        .arg(out)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code(), text)
}

const EXAMPLE: [&str; 6] = [
    "--config",
    "deploy/simulate/rules.yaml",
    "--traffic",
    "deploy/simulate/bursty.yaml",
    "--algorithm",
    "sliding_log,leaky_bucket:20,token_bucket",
];

#[test]
fn the_example_compares_four_strategies() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = simulate(&EXAMPLE, dir.path());
    assert_eq!(code, Some(0), "{out}");
    let summary = std::fs::read_to_string(dir.path().join("summary.csv")).unwrap();
    // The report docs/ links to is this very run (regenerate it with the same command, `--out docs/simulate`).
    let linked =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/simulate/summary.csv")).unwrap();
    assert_eq!(summary, linked, "docs/simulate/ is out of date");
    let rows: Vec<Vec<&str>> = summary.lines().skip(1).map(|l| l.split(',').collect()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(
        names,
        [
            "fixed_window (the rule's)",
            "sliding_log",
            "leaky_bucket burst 20",
            "token_bucket burst 100"
        ]
    );
    let column = |name: &str, i: usize| -> f64 { rows.iter().find(|r| r[0] == name).unwrap()[i].parse().unwrap() };
    // The same requests for every strategy; what each lets through differs as the algorithms promise.
    assert!(rows.iter().all(|r| r[1] == rows[0][1]));
    assert_eq!(
        column("sliding_log", 7),
        1.0,
        "a sliding log never admits more than the limit in a window"
    );
    assert!(
        column("fixed_window (the rule's)", 7) > 1.2,
        "a fixed window lets a burst through at its edges"
    );
    assert!(
        column("token_bucket burst 100", 7) <= 2.0,
        "a token bucket: at most burst + limit per window"
    );
    assert!(
        column("leaky_bucket burst 20", 10) > 0.0,
        "the leaky bucket's queue delay"
    );
    // Every second of every strategy in per_second.csv; the report draws each.
    let per_second = std::fs::read_to_string(dir.path().join("per_second.csv")).unwrap();
    assert_eq!(per_second.lines().count(), 1 + 4 * 121);
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 5, "one chart of all, one per strategy");
    for name in names {
        assert!(
            html.contains(&name.replace('\'', "&#39;")) || html.contains(name),
            "{name}"
        );
    }
    assert!(out.contains("decisions/s; report in"), "{out}");
}

/// The bucketed window's sub-windows come after its name; each run holds the window to the limit plus one
/// sub-window's count (here, ten sub-windows of one second).
#[test]
fn a_bucketed_window_is_simulated_with_its_sub_windows() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = EXAMPLE.to_vec();
    args[5] = "bucketed_window:5,bucketed_window:10";
    let (code, out) = simulate(&args, dir.path());
    assert_eq!(code, Some(0), "{out}");
    let summary = std::fs::read_to_string(dir.path().join("summary.csv")).unwrap();
    let rows: Vec<Vec<&str>> = summary.lines().skip(1).map(|l| l.split(',').collect()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(
        names,
        [
            "fixed_window (the rule's)",
            "bucketed_window 5 sub-windows",
            "bucketed_window 10 sub-windows"
        ]
    );
    let worst = |i: usize| -> u64 { rows[i][6].parse().unwrap() };
    assert!(
        worst(2) <= worst(1) && worst(1) < worst(0),
        "finer sub-windows, closer to the limit: {summary}"
    );
}

#[test]
fn mistakes_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let traffic = dir.path().join("t.yaml");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--algorithm".into(), "gcra".into()],
            "--algorithm 'gcra': unknown (expected one of fixed_window",
        ),
        (
            vec!["--algorithm".into(), "queue".into()],
            "--algorithm 'queue': not simulated",
        ),
        (
            vec!["--algorithm".into(), "sliding_log:5".into()],
            "only token_bucket and leaky_bucket take a burst",
        ),
    ];
    for (extra, want) in cases {
        let mut args: Vec<String> = EXAMPLE[..4].iter().map(|s| s.to_string()).collect();
        args.extend(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, text) = simulate(&args, &out);
        assert_eq!(code, Some(1), "{text}");
        assert!(text.contains(want), "{want}: {text}");
        assert!(!out.exists(), "nothing written for a refused simulation");
    }
    std::fs::write(&traffic, "domain: api\nkey: user\nseconds: 10\nrate: 5\nshape: waves\n").unwrap();
    let t = traffic.to_str().unwrap();
    let (code, text) = simulate(&["--config", "deploy/simulate/rules.yaml", "--traffic", t], &out);
    assert_eq!(code, Some(1));
    assert!(text.contains("t.yaml' line 5: shape: unknown shape 'waves'"), "{text}");
    std::fs::write(&traffic, "domain: api\nkey: nobody\nseconds: 10\nrate: 5\n").unwrap();
    let (_, text) = simulate(&["--config", "deploy/simulate/rules.yaml", "--traffic", t], &out);
    assert!(
        text.contains("domain 'api' has no limited rule for key 'nobody'"),
        "{text}"
    );
    std::fs::write(dir.path().join("trace.csv"), "seconds,key\n0.1,a\n0.2\n").unwrap();
    std::fs::write(&traffic, "domain: api\nkey: user\ntrace: trace.csv\n").unwrap();
    let (_, text) = simulate(&["--config", "deploy/simulate/rules.yaml", "--traffic", t], &out);
    assert!(
        text.contains("trace.csv' line 3: line: expected 'seconds,key'"),
        "{text}"
    );
}
