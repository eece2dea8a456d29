//! The command line: `sluice serve`, `sluice check` and `sluice simulate`, and the only place that knows flag names.
//!
//! `serve`'s flags are grouped by concern, a module each, and each group turns its flags into the settings of what
//! it configures: `rules` (files or an xDS server), `listeners` (addresses, TLS, the admin token), `storage` (Redis,
//! key prefix, failure policy, breaker, local cache), `regions`, `caps` (request and stream bounds), `answers` (what
//! a decision's answer carries), `telemetry` (logs, traces, what the metrics count); `serve` gathers them, with the
//! process's own flags, and starts the server. [`environment`] turns envoyproxy/ratelimit's environment variables
//! into `serve` flags before the command line is parsed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::metrics::Metrics;
use crate::rules::{Domains, RuleSet};
use crate::simulate::{self, Simulation};

mod answers;
mod caps;
pub mod environment;
mod listeners;
mod regions;
mod rules;
mod serve;
mod storage;
mod telemetry;
mod values;

/// A rate-limit decision service, wire-compatible with Envoy's rate limit service.
///
/// A flag given twice takes its last value, so that the command line wins over the flags the compatibility mode
/// derives from the environment.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gRPC rate limit services and the HTTP endpoints.
    Serve(Box<serve::ServeArgs>),
    /// Validate a configuration and print its domains and rules; exit 1 with the error otherwise.
    Check {
        /// A YAML file, or a directory of *.yaml/*.yml files (one domain per file).
        #[arg(long, env = "SLUICE_CONFIG")]
        config: PathBuf,
        /// Files of one domain merge into one tree (a top-level descriptor defined twice is an error).
        #[arg(long, env = "SLUICE_MERGE_DOMAINS")]
        merge_domains: bool,
    },
    /// Replay traffic (a shape or a CSV trace) through the decision core once per candidate algorithm, and write
    /// what each did to it: report.html with charts, summary.csv, per_second.csv.
    Simulate {
        /// The rules: a YAML file, or a directory of them.
        #[arg(long)]
        config: PathBuf,
        /// The traffic: a YAML file describing a shape, or naming a CSV trace (see docs/src/simulate.md).
        #[arg(long)]
        traffic: PathBuf,
        /// A candidate algorithm besides the rule's own; repeat, or separate with commas.
        #[arg(long = "algorithm", value_delimiter = ',')]
        algorithms: Vec<String>,
        /// Where the report is written (created when missing).
        #[arg(long, default_value = "simulate-report")]
        out: PathBuf,
    },
}

/// Runs the command `args` (the process's arguments, the binary's name first) names, with the compatibility mode's
/// flags put in first when it is asked for; returns the process's exit code.
pub fn run(mut args: Vec<OsString>) -> ExitCode {
    let env = |name: &str| std::env::var(name).ok();
    let mut compat = None;
    if environment::requested(&args, env) {
        let translation = match environment::translate(env) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        // The derived flags go right after `serve`, so that the flags on the command line come later and win. Run
        // as `ratelimit`, the binary serves: the reference takes no command.
        let at = match args.get(1).and_then(|a| a.to_str()) {
            Some("serve") => Some(2),
            Some("check" | "simulate") => None,
            _ => {
                args.insert(1, "serve".into());
                Some(2)
            }
        };
        if let Some(at) = at {
            args.splice(at..at, translation.args.iter().map(OsString::from));
            compat = Some(translation);
        }
    }
    match Cli::parse_from(args).command {
        Command::Check { config, merge_domains } => check(&config, rules::domains(merge_domains)),
        Command::Serve(args) => serve::serve(*args, compat),
        Command::Simulate {
            config,
            traffic,
            algorithms,
            out,
        } => run_simulation(Simulation {
            config,
            traffic,
            algorithms,
            out,
        }),
    }
}

/// `sluice simulate`: runs the simulation and prints a line per algorithm.
fn run_simulation(sim: Simulation) -> ExitCode {
    match simulate::run(&sim) {
        Ok(done) => {
            for f in &done.figures {
                let delay = f.delay_ms.map_or(String::new(), |(m, p)| {
                    format!(", queue delay {m:.1} ms mean, {p:.1} ms p99")
                });
                println!(
                    "{}: {} of {} admitted, worst window {} ({:.2}x the limit), {} around window edges, fairness {:.3}{delay}",
                    f.algorithm, f.admitted, f.requests, f.worst_window, f.overshoot, f.edge_burst, f.fairness
                );
            }
            println!(
                "{} requests per algorithm, {:.0} decisions/s; report in {}",
                done.requests,
                done.decisions_per_second,
                sim.out.join("report.html").display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `sluice check`: compiles the configuration and prints its summary.
fn check(config: &Path, domains: Domains) -> ExitCode {
    let compiled =
        crate::config::load(config).and_then(|files| RuleSet::compile_owned(files, &Metrics::discarded(0.8), domains));
    match compiled {
        Ok(rules) => {
            print!("{}", rules.summary());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own checks over every command: the flags a flag requires or conflicts with exist, whatever group they
    /// are in, and no two flags share a name.
    #[test]
    fn the_flags_are_consistent_across_groups() {
        super::Cli::command().debug_assert();
    }

    /// `serve --help` says what the admin token guards: the admin calls, `/offenders` and the dashboard.
    #[test]
    fn the_admin_token_help_names_everything_it_guards() {
        let mut cli = super::Cli::command();
        let serve = cli.find_subcommand_mut("serve").expect("a serve command");
        let help = serve.render_long_help().to_string();
        let flag = help
            .split("--admin-token")
            .nth(1)
            .expect("--admin-token in serve --help");
        let text: String = flag
            .split("\n  -")
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for part in [
            "Reset",
            "GetTopOffenders",
            "GET /offenders",
            "the dashboard (/ui",
            "?token=<token>",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
