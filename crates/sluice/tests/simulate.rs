//! `sluice simulate`, the binary, on the example of `deploy/simulate/`: the write-up's four strategies on one bursty
//! trace, the report and its CSV (the copy in `docs/simulate/` up to date); the leaky bucket's queue delay against a
//! hand model of its queue; mistakes refused before anything runs, naming the flag, file, line or field.

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
    assert_eq!(
        per_second.lines().count(),
        1 + 4 * 120,
        "the trace's 120 seconds, none after"
    );
    // The last second was offered as many requests as any: no drop to nothing at the right edge.
    for name in &names {
        let last = per_second.lines().rfind(|l| l.split(',').nth(1) == Some(name)).unwrap();
        let offered: u64 = last.split(',').nth(2).unwrap().parse().unwrap();
        assert!(last.starts_with("119,") && offered > 0, "{last}");
    }
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        8,
        "one chart of all, worst window, fairness and delay drawn, one per strategy"
    );
    // The worst window over the limit and fairness are drawn per strategy, each bar with its value.
    let figure = |id: &str| -> &str {
        let start = html
            .find(&format!("<figure id=\"{id}\">"))
            .unwrap_or_else(|| panic!("{id}"));
        &html[start..start + html[start..].find("</figure>").unwrap()]
    };
    for row in &rows {
        let name = row[0].replace('\'', "&apos;");
        let overshoot: f64 = row[7].parse().unwrap();
        let fairness: f64 = row[9].parse().unwrap();
        for (id, value) in [("worst-window", overshoot), ("fairness", fairness)] {
            let texts: Vec<&str> = figure(id)
                .split("<text")
                .skip(1)
                .filter_map(|t| Some(t.split_once('>')?.1.split("</text>").next()?.trim()))
                .collect();
            assert!(texts.contains(&name.as_str()), "{name} in {id}: {texts:?}");
            assert!(
                texts.contains(&value.to_string().as_str()),
                "{value} in {id}: {texts:?}"
            );
        }
    }
    assert!(figure("delay").contains("leaky_bucket burst 20 p99"));
    for name in names {
        assert!(
            html.contains(&name.replace('\'', "&#39;")) || html.contains(name),
            "{name}"
        );
    }
    assert!(out.contains("decisions/s; report in"), "{out}");
}

/// The leaky bucket's queue delay is the wait of each admitted request in a queue served at the limit's rate, to
/// the microsecond: checked against a model of that queue written here, on a trace of one user's 150 requests. The
/// trace's last, partial second is left out of the per-second figures.
#[test]
fn the_leaky_buckets_delay_is_the_wait_in_its_queue() {
    let dir = tempfile::tempdir().unwrap();
    // 150 requests 0 to 150 ms apart (a fixed pseudo-random sequence): more than the limit's 10 a second on average.
    let mut times_us = Vec::new();
    let (mut t, mut x) = (0u64, 12_345u64);
    for _ in 0..150 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        t += (x >> 33) % 150_000;
        times_us.push(t);
    }
    let trace: String = times_us
        .iter()
        .map(|t| format!("{}.{:06},alice\n", t / 1_000_000, t % 1_000_000))
        .collect();
    std::fs::write(dir.path().join("trace.csv"), format!("seconds,key\n{trace}")).unwrap();
    let traffic = dir.path().join("traffic.yaml");
    std::fs::write(&traffic, "domain: api\nkey: user\ntrace: trace.csv\n").unwrap();
    let out = dir.path().join("report");
    let args = [
        "--config",
        "deploy/simulate/rules.yaml",
        "--traffic",
        traffic.to_str().unwrap(),
        "--algorithm",
        "leaky_bucket:3",
    ];
    let (code, text) = simulate(&args, &out);
    assert_eq!(code, Some(0), "{text}");

    // The model: 100 per 10 s is one request served every 100 ms; a bucket of 3 admits a request when the queue it
    // finds would be served within 3 intervals once it joins, and the request then waits for the queue ahead of it.
    let (interval, burst) = (100_000u64, 3u64);
    let (mut free_at, mut waits) = (0u64, Vec::new());
    for &t in &times_us {
        let ahead = free_at.saturating_sub(t);
        if ahead + interval <= burst * interval {
            waits.push(ahead);
            free_at = free_at.max(t) + interval;
        }
    }
    let mean_ms = waits.iter().sum::<u64>() as f64 / waits.len() as f64 / 1_000.0;
    let mut sorted = waits.clone();
    sorted.sort_unstable();
    let p99_ms = sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)] as f64 / 1_000.0;
    assert!(mean_ms > 50.0, "the trace keeps the queue busy: {mean_ms}");

    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let row: Vec<&str> = summary
        .lines()
        .find(|l| l.starts_with("leaky_bucket burst 3,"))
        .unwrap()
        .split(',')
        .collect();
    assert_eq!(row[2], waits.len().to_string(), "admitted: {summary}");
    assert_eq!(
        (row[10], row[11]),
        (format!("{mean_ms:.1}").as_str(), format!("{p99_ms:.1}").as_str()),
        "mean and p99 delay: {summary}"
    );

    // The trace ends within its last second: the per-second figures stop at the last whole one.
    let last_second = times_us.last().unwrap() / 1_000_000;
    let per_second = std::fs::read_to_string(out.join("per_second.csv")).unwrap();
    let seconds: Vec<u64> = per_second
        .lines()
        .skip(1)
        .filter(|l| l.contains(",leaky_bucket burst 3,"))
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(seconds, (0..last_second).collect::<Vec<_>>(), "{per_second}");
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

/// The data lines of an SVG chart (a polyline of more than 50 points: not an axis, a tick or a legend's swatch), in
/// drawing order: stroke colour and dash (empty: solid).
fn data_lines(svg: &str) -> Vec<(String, String)> {
    let attribute = |tag: &str, name: &str| -> String {
        let Some(at) = tag.find(&format!(" {name}=\"")) else {
            return String::new();
        };
        tag[at + name.len() + 3..]
            .split('"')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    svg.split("<polyline")
        .skip(1)
        .map(|t| t.split('>').next().unwrap())
        .filter(|tag| attribute(tag, "points").split(' ').count() > 50)
        .map(|tag| (attribute(tag, "stroke"), attribute(tag, "stroke-dasharray")))
        .collect()
}

/// The report reads: every text at least 11 px; the offered load a grey area behind the lines of the chart of all,
/// the candidates' lines each of its own colour and dash; and a colour keeps one meaning across the charts: a
/// candidate's colour is its line there, its bars, and what it admitted in its own chart, where what it denied is the
/// one black dotted line, in no candidate's colour.
#[test]
fn the_report_is_legible_and_its_colours_keep_one_meaning() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = simulate(&EXAMPLE, dir.path());
    assert_eq!(code, Some(0), "{out}");
    let html = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    let sizes: Vec<f64> = html
        .split("font-size=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect();
    assert!(sizes.len() > 100, "{sizes:?}");
    for size in &sizes {
        assert!(*size >= 11.0, "a text of {size} px");
    }
    let figures: Vec<&str> = html
        .split("<figure")
        .skip(1)
        .map(|f| f.split("</figure>").next().unwrap())
        .collect();
    let all = figures.iter().find(|f| f.starts_with(" id=\"admitted\"")).unwrap();
    // The offered load: a filled grey area, drawn before (behind) every line.
    let area = all.find("<polygon").expect("the offered load's area");
    assert!(
        all[area..].split('>').next().unwrap().contains("fill=\"#DADADA\""),
        "{all}"
    );
    let lines = data_lines(all);
    assert_eq!(
        lines.len(),
        1 + 4,
        "the offered load's outline and four candidates: {lines:?}"
    );
    let (offered, candidates) = (&lines[0], &lines[1..]);
    for line in &lines {
        let drawn = all.find(&format!("stroke=\"{}\"", line.0)).unwrap();
        assert!(area < drawn, "the area behind the lines: {line:?}");
    }
    assert_eq!(offered.0, "#969696", "the offered load's outline is grey");
    for (i, a) in candidates.iter().enumerate() {
        assert!(![offered.0.as_str(), "#000000"].contains(&a.0.as_str()), "{a:?}");
        for b in &candidates[i + 1..] {
            assert!(a.0 != b.0 && a.1 != b.1, "two candidates drawn alike: {a:?} {b:?}");
        }
    }
    // Each candidate's bars are in its colour.
    for id in ["worst-window", "fairness"] {
        let chart = figures
            .iter()
            .find(|f| f.starts_with(&format!(" id=\"{id}\"")))
            .unwrap();
        let fills: Vec<&str> = chart
            .split("<rect")
            .skip(2)
            .map(|r| r.split("fill=\"").nth(1).unwrap().split('"').next().unwrap())
            .collect();
        let colours: Vec<&str> = candidates.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(fills, colours, "{id}");
    }
    let own: Vec<&&str> = figures
        .iter()
        .filter(|f| f.starts_with(" class=\"algorithm\""))
        .collect();
    assert_eq!(own.len(), 4);
    for (chart, candidate) in own.iter().zip(candidates) {
        let lines = data_lines(chart);
        assert_eq!(
            lines,
            [candidate.clone(), ("#000000".to_string(), "2 3".to_string())],
            "admitted in the candidate's colour and dash, denied black and dotted"
        );
    }
}
