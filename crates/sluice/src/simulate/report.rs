//! What a simulation reports: per candidate, the figures that tell algorithms apart (the worst window against the
//! nominal rate, the burst admitted around window edges, per-key fairness, a bucket's queue delay), as an HTML page
//! with SVG charts and as CSV.

use std::fmt::Write as _;

use super::replay::{Run, START_US, TICK_US};
use super::traffic::Traffic;
use crate::charts::{Bar, Pen, Series, bar_chart, escape, line_chart};

/// The figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub algorithm: String,
    pub requests: u64,
    pub admitted: u64,
    pub denied: u64,
    /// The limit per window, and the window in seconds.
    pub limit: u32,
    pub window_seconds: f64,
    /// For one key (the worst of the busiest keys), the most admitted in any span of one window's length (at 100 ms
    /// resolution), and that over the limit.
    pub worst_window: u64,
    pub overshoot: f64,
    /// For one key, the most admitted in a window's length centred on a window boundary.
    pub edge_burst: u64,
    /// Jain's index of the keys' admitted shares of their requests: 1 when every key got the same share.
    pub fairness: f64,
    /// For the leaky bucket: the mean and 99th percentile wait of an admitted request in a queue served at the limit's
    /// rate, in milliseconds.
    pub delay_ms: Option<(f64, f64)>,
}

/// The figures of `run`.
pub fn figures(run: &Run) -> Figures {
    let window_us = run.limit.window_us();
    let w = (window_us / TICK_US).max(1) as usize;
    let boundaries: Vec<usize> = (1..run.admitted.len())
        .filter(|&i| (START_US + i as u64 * TICK_US) % window_us == 0)
        .collect();
    // Each tracked key against its own limit: the worst of them.
    let (mut worst, mut edge) = (0, 0);
    for ticks in &run.admitted_by_key {
        let sum = |from: usize, to: usize| -> u64 {
            ticks[from.min(ticks.len())..to.min(ticks.len())]
                .iter()
                .map(|&n| u64::from(n))
                .sum()
        };
        let mut rolling: u64 = 0;
        for (i, &n) in ticks.iter().enumerate() {
            rolling += u64::from(n);
            if i >= w {
                rolling -= u64::from(ticks[i - w]);
            }
            worst = worst.max(rolling);
        }
        for &b in &boundaries {
            edge = edge.max(sum(b.saturating_sub(w / 2), b + w.div_ceil(2)));
        }
    }
    let shares: Vec<f64> = run
        .per_key
        .iter()
        .filter(|(requested, _)| *requested > 0)
        .map(|&(requested, admitted)| admitted as f64 / requested as f64)
        .collect();
    let (s, s2) = shares.iter().fold((0.0, 0.0), |(s, s2), x| (s + x, s2 + x * x));
    let fairness = if s2 > 0.0 {
        s * s / (shares.len() as f64 * s2)
    } else {
        1.0
    };
    let delay_ms = (!run.delays_us.is_empty()).then(|| {
        let mut d = run.delays_us.clone();
        d.sort_unstable();
        let mean = d.iter().sum::<u64>() as f64 / d.len() as f64 / 1_000.0;
        let p99 = d[(d.len() * 99 / 100).min(d.len() - 1)] as f64 / 1_000.0;
        (mean, p99)
    });
    let admitted: u64 = run.admitted.iter().map(|&n| u64::from(n)).sum();
    let denied: u64 = run.denied.iter().map(|&n| u64::from(n)).sum();
    Figures {
        algorithm: label(run),
        requests: admitted + denied,
        admitted,
        denied,
        limit: run.limit.requests,
        window_seconds: window_us as f64 / 1e6,
        worst_window: worst,
        overshoot: worst as f64 / f64::from(run.limit.requests.max(1)),
        edge_burst: edge,
        fairness,
        delay_ms,
    }
}

/// The run's name in charts and tables: its algorithm, marked when it is the rule's own.
pub fn label(run: &Run) -> String {
    let mut label = run.algorithm.name().to_string();
    if run.algorithm.is_bucket() {
        label += &format!(" burst {}", run.limit.burst);
    } else if run.algorithm.has_sub_windows() {
        label += &format!(" {} sub-windows", run.limit.burst);
    }
    if run.own {
        label += " (the rule's)";
    }
    label
}

/// Per whole second the run charts ([`Run::charted_seconds`]): the counts of `ticks`.
fn per_second(run: &Run, ticks: &[u32]) -> Vec<u64> {
    let per = (1_000_000 / TICK_US) as usize;
    ticks
        .chunks(per)
        .take(run.charted_seconds)
        .map(|c| c.iter().map(|&n| u64::from(n)).sum())
        .collect()
}

/// `per_second.csv`: second, algorithm, offered, admitted, denied.
pub fn per_second_csv(runs: &[Run]) -> String {
    let mut out = String::from("second,algorithm,offered,admitted,denied\n");
    for run in runs {
        let (a, d) = (per_second(run, &run.admitted), per_second(run, &run.denied));
        for (s, (a, d)) in a.iter().zip(&d).enumerate() {
            let _ = writeln!(out, "{s},{},{},{a},{d}", label(run), a + d);
        }
    }
    out
}

/// `summary.csv`: one line of figures per candidate.
pub fn summary_csv(figures: &[Figures]) -> String {
    let mut out = String::from(
        "algorithm,requests,admitted,denied,limit,window_seconds,worst_window,overshoot,edge_burst,fairness,mean_delay_ms,p99_delay_ms\n",
    );
    for f in figures {
        let (mean, p99) = f.delay_ms.map_or((String::new(), String::new()), |(m, p)| {
            (format!("{m:.1}"), format!("{p:.1}"))
        });
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{:.3},{},{:.4},{mean},{p99}",
            f.algorithm,
            f.requests,
            f.admitted,
            f.denied,
            f.limit,
            f.window_seconds,
            f.worst_window,
            f.overshoot,
            f.edge_burst,
            f.fairness
        );
    }
    out
}

/// The HTML report: the traffic, a chart of what every candidate admitted, one chart per candidate, the figures.
pub fn html(traffic: &Traffic, runs: &[Run], figures: &[Figures], config: &str, traffic_file: &str) -> String {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>sluice simulate: {title}</title>\n<style>body{{font-family:sans-serif;margin:2em;max-width:1000px}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f4f4f4}}td:first-child{{text-align:left}}figure{{margin:1em 0}}</style></head><body>\n<h1>What each algorithm does to the traffic</h1>\n<p>Rules <code>{config}</code>, traffic <code>{traffic_file}</code>: {requests} requests over {seconds} s in domain <code>{domain}</code>, key <code>{key}</code> ({keys} distinct values). Limit: {limit} per {window} s. Each candidate replays the same requests through the decision core (in-memory store, time injected).</p>\n",
        title = escape(traffic_file),
        config = escape(config),
        traffic_file = escape(traffic_file),
        requests = traffic.arrivals.len(),
        seconds = traffic.seconds,
        domain = escape(&traffic.domain),
        key = escape(&traffic.key),
        keys = traffic.keys.len(),
        limit = figures.first().map_or(0, |f| f.limit),
        window = figures.first().map_or(0.0, |f| f.window_seconds),
    );
    let _ = writeln!(page, "<figure id=\"admitted\">{}</figure>", admitted_chart(runs));
    page.push_str("<h2>Figures</h2>\n<table id=\"figures\"><tr><th>algorithm</th><th>requests</th><th>admitted</th><th>denied</th><th>worst window</th><th>worst window / limit</th><th>burst at window edges</th><th>fairness (Jain)</th><th>queue delay mean / p99 (ms)</th></tr>\n");
    for f in figures {
        figure_row(&mut page, f);
    }
    page.push_str("</table>\n");
    figure_charts(&mut page, figures);
    page.push_str("<p>Worst window: for one key (the worst of the 20 busiest), the most admitted in any span of one window's length (100 ms resolution), and that over the limit. Burst at window edges: for one key, the most admitted in a window's length centred on a window boundary (a fixed window lets up to twice its limit through there). Fairness: Jain's index of each key's admitted share of its requests. Queue delay: for the leaky bucket, how long an admitted request waits in a queue served at the limit's rate (for the requests ahead of it, to the microsecond), as a stream-coupled leaky bucket holds it.</p>\n<h2>Each algorithm</h2>\n");
    for (i, run) in runs.iter().enumerate() {
        algorithm_figure(&mut page, run, i);
    }
    page.push_str("<p>The same figures as CSV: <a href=\"summary.csv\">summary.csv</a>, <a href=\"per_second.csv\">per_second.csv</a>.</p>\n</body></html>\n");
    page
}

/// The chart of what every candidate admitted per second, over what was offered (a grey area behind the lines).
fn admitted_chart(runs: &[Run]) -> String {
    let offered = runs.first().map(|r| {
        let (a, d) = (per_second(r, &r.admitted), per_second(r, &r.denied));
        a.iter()
            .zip(&d)
            .enumerate()
            .map(|(s, (a, d))| (s as f64, (a + d) as f64))
            .collect::<Vec<_>>()
    });
    let mut all = vec![Series {
        name: "offered".into(),
        points: offered.unwrap_or_default(),
        pen: Pen::Offered,
    }];
    for (i, run) in runs.iter().enumerate() {
        all.push(Series {
            name: label(run),
            points: per_second(run, &run.admitted)
                .iter()
                .enumerate()
                .map(|(s, &n)| (s as f64, n as f64))
                .collect(),
            pen: Pen::Candidate(i),
        });
    }
    line_chart(
        "Admitted per second, by algorithm",
        "second",
        "requests / s",
        &all,
        (960, 420),
    )
}

/// The figures that tell candidates apart, drawn: the worst window over the limit, fairness, and the leaky bucket's
/// queue delay when a candidate has one. Each candidate keeps its colour of the chart of all.
fn figure_charts(page: &mut String, figures: &[Figures]) {
    let bars = |value: &dyn Fn(&Figures) -> f64| -> Vec<Bar> {
        figures
            .iter()
            .enumerate()
            .map(|(i, f)| Bar {
                name: f.algorithm.clone(),
                value: value(f),
                candidate: i,
            })
            .collect()
    };
    let height = 90 + 34 * figures.len() as u32;
    let worst = bar_chart(
        "Worst window / limit (1: never past the limit)",
        "admitted in the worst window, over the limit",
        &bars(&|f| (f.overshoot * 1_000.0).round() / 1_000.0),
        Some((1.0, "limit")),
        (960, height),
    );
    let _ = writeln!(page, "<figure id=\"worst-window\">{worst}</figure>");
    let fairness = bar_chart(
        "Fairness: Jain's index of the keys' admitted shares (1: every key the same share)",
        "Jain's index",
        &bars(&|f| (f.fairness * 10_000.0).round() / 10_000.0),
        Some((1.0, "equal")),
        (960, height),
    );
    let _ = writeln!(page, "<figure id=\"fairness\">{fairness}</figure>");
    let delays: Vec<Bar> = figures
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((i, f, f.delay_ms?)))
        .flat_map(|(i, f, (mean, p99))| {
            [("mean", mean), ("p99", p99)].map(|(what, ms)| Bar {
                name: format!("{} {what}", f.algorithm),
                value: (ms * 10.0).round() / 10.0,
                candidate: i,
            })
        })
        .collect();
    if !delays.is_empty() {
        let delay = bar_chart(
            "Queue delay of an admitted request, mean and 99th percentile",
            "milliseconds",
            &delays,
            None,
            (960, 90 + 34 * delays.len() as u32),
        );
        let _ = writeln!(page, "<figure id=\"delay\">{delay}</figure>");
    }
}

/// A candidate's row in the table of figures.
fn figure_row(page: &mut String, f: &Figures) {
    let delay = f.delay_ms.map_or("-".to_string(), |(m, p)| format!("{m:.1} / {p:.1}"));
    let _ = writeln!(
        page,
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td><td>{:.3}</td><td>{delay}</td></tr>",
        escape(&f.algorithm),
        f.requests,
        f.admitted,
        f.denied,
        f.worst_window,
        f.overshoot,
        f.edge_burst,
        f.fairness
    );
}

/// A candidate's own chart (candidate `i`): what it admitted per second, in its colour of the chart of all, and what
/// it denied.
fn algorithm_figure(page: &mut String, run: &Run, i: usize) {
    let admitted: Vec<(f64, f64)> = per_second(run, &run.admitted)
        .iter()
        .enumerate()
        .map(|(s, &n)| (s as f64, n as f64))
        .collect();
    let denied: Vec<(f64, f64)> = per_second(run, &run.denied)
        .iter()
        .enumerate()
        .map(|(s, &n)| (s as f64, n as f64))
        .collect();
    let series = [
        Series {
            name: "admitted".into(),
            points: admitted,
            pen: Pen::Candidate(i),
        },
        Series {
            name: "denied".into(),
            points: denied,
            pen: Pen::Denied,
        },
    ];
    let _ = writeln!(
        page,
        "<figure class=\"algorithm\" data-algorithm=\"{}\">{}</figure>",
        run.algorithm.name(),
        line_chart(&label(run), "second", "requests / s", &series, (960, 300))
    );
}
