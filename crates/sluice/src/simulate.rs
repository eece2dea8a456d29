//! `sluice simulate`: a strategy lab. Given rules (the usual YAML) and traffic (a shape or a recorded trace, see
//! [`traffic`]), it replays the traffic through the decision core with injected time once per candidate algorithm
//! (the rule's own and any named), in parallel, and writes what each did to the traffic: `report.html` with SVG
//! charts, `summary.csv` and `per_second.csv` ([`report`]).
//!
//! Every candidate counts every limit of the traffic's domain with its algorithm, the rule's `burst` kept for the
//! buckets. The algorithms that hold state a client must end (`concurrency`'s leases, `queue`'s entries, which
//! workers drain) are not simulated: a leaky bucket with a `burst` is the same meter, and its report shows the wait a
//! queue served at the limit's rate would impose.

pub mod replay;
pub mod report;
pub mod traffic;

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::metrics::Metrics;
use crate::rules::{Algorithm, RuleSet};

/// What to simulate and where the report goes.
#[derive(Debug, Clone)]
pub struct Simulation {
    pub config: PathBuf,
    pub traffic: PathBuf,
    /// Candidate algorithms besides the rule's own.
    pub algorithms: Vec<String>,
    pub out: PathBuf,
}

/// What a simulation did: its figures, and how fast it replayed.
pub struct Simulated {
    pub figures: Vec<report::Figures>,
    pub requests: usize,
    pub decisions_per_second: f64,
}

/// One algorithm to replay: which, its bucket size (`leaky_bucket:20`), and whether it is the rule's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    algorithm: Algorithm,
    burst: Option<u32>,
    own: bool,
}

/// The candidates: the rule's own algorithm, then each named one (`NAME`; for the buckets `NAME:BURST`, for a
/// bucketed window `bucketed_window:SUB_WINDOWS`), once, each checked before anything runs.
fn candidates(own: Algorithm, named: &[String]) -> Result<Vec<Candidate>, String> {
    let mut out = vec![Candidate {
        algorithm: own,
        burst: None,
        own: true,
    }];
    for spec in named {
        let (name, burst) = match spec.split_once(':') {
            Some((name, burst)) => {
                let burst = burst
                    .parse::<u32>()
                    .ok()
                    .filter(|&b| b > 0)
                    .ok_or_else(|| format!("--algorithm '{spec}': the burst after ':' is a whole number from 1"))?;
                (name, Some(burst))
            }
            None => (spec.as_str(), None),
        };
        let algorithm = Algorithm::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            format!("--algorithm '{spec}': unknown (expected one of {})", names.join(", "))
        })?;
        if algorithm.ended_by_clients() {
            return Err(format!(
                "--algorithm '{spec}': not simulated (its state is ended by clients: leases released, entries drained); a leaky_bucket with a burst is the same meter"
            ));
        }
        if burst.is_some() && !algorithm.is_bucket() && !algorithm.has_sub_windows() {
            return Err(format!(
                "--algorithm '{spec}': only token_bucket and leaky_bucket take a burst (and bucketed_window a number \
                 of sub-windows)"
            ));
        }
        let candidate = Candidate {
            algorithm,
            burst,
            own: false,
        };
        if !out.iter().any(|c| c.algorithm == algorithm && c.burst == burst) {
            out.push(candidate);
        }
    }
    Ok(out)
}

/// Runs a simulation and writes its report.
pub fn run(sim: &Simulation) -> Result<Simulated, String> {
    let files = crate::config::load(&sim.config).map_err(|e| e.to_string())?;
    let traffic = traffic::load(&sim.traffic)?;
    let metrics = Metrics::discarded(0.8);
    let compiled = RuleSet::compile(&files, &metrics).map_err(|e| e.to_string())?;
    let domain = compiled.domain(&traffic.domain).ok_or_else(|| {
        format!(
            "traffic '{}': domain '{}' is not configured",
            sim.traffic.display(),
            traffic.domain
        )
    })?;
    let own = domain
        .find(&[(traffic.key.as_str(), traffic.keys[0].as_str())])
        .and_then(|m| m.rule.tiers.first().map(|t| t.limit.algorithm))
        .ok_or_else(|| {
            format!(
                "traffic '{}': domain '{}' has no limited rule for key '{}'",
                sim.traffic.display(),
                traffic.domain,
                traffic.key
            )
        })?;
    let candidates = candidates(own, &sim.algorithms)?;
    if own.ended_by_clients() {
        return Err(format!("the rule counts with {}, which is not simulated", own.name()));
    }
    let mut rule_sets = Vec::new();
    for c in &candidates {
        let files = replay::with_algorithm(&files, &traffic.domain, c.algorithm, c.burst);
        rule_sets.push(RuleSet::compile(&files, &metrics).map_err(|e| format!("{}: {e}", c.algorithm.name()))?);
    }
    std::fs::create_dir_all(&sim.out).map_err(|e| format!("--out '{}': {e}", sim.out.display()))?;
    let start = Instant::now();
    let runs: Result<Vec<replay::Run>, String> = std::thread::scope(|scope| {
        let handles: Vec<_> = rule_sets
            .into_iter()
            .zip(&candidates)
            .map(|(rules, c)| {
                let traffic = &traffic;
                scope.spawn(move || replay::replay(rules, traffic, c.algorithm, c.own))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a replay panicked".into())))
            .collect()
    });
    let runs = runs?;
    let elapsed = start.elapsed().as_secs_f64();
    let figures: Vec<report::Figures> = runs.iter().map(report::figures).collect();
    let write = |name: &str, text: String| {
        let path = sim.out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write '{}': {e}", path.display()))
    };
    write("per_second.csv", report::per_second_csv(&runs))?;
    write("summary.csv", report::summary_csv(&figures))?;
    write(
        "report.html",
        report::html(&traffic, &runs, &figures, &display(&sim.config), &display(&sim.traffic)),
    )?;
    let decisions = traffic.arrivals.len() * runs.len();
    Ok(Simulated {
        figures,
        requests: traffic.arrivals.len(),
        decisions_per_second: decisions as f64 / elapsed.max(1e-9),
    })
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
