//! How the decision script is called: as a Redis function where the server allows it (Redis 7 or later, `FUNCTION
//! LOAD` once per server, then `FCALL`), else by EVALSHA. The script defines some fifty functions and a dozen tables
//! before it decides anything; run by EVALSHA it makes them again at every call (about 10 µs of Redis's time, more
//! than deciding a batch of a dozen descriptors), where a function library makes them once, when it is loaded.
//!
//! The library is named by the script's SHA1 (`sluice_<16 hex digits>`), so instances of two versions sharing a Redis
//! during an upgrade each call their own. A server that refuses functions (Redis 6: unknown command; an ACL without
//! `fcall` or without `function|load`: NOPERM) turns this store to EVALSHA, with a warning: the answers are the same, only
//! the cost differs. A minute later it tries functions again (the first call fails with the function unknown or
//! refused, is answered by loading the library, or the script where functions are still refused, and is sent again),
//! so that a grant of `fcall` and `function|load`, or a failover to a server that has functions, needs no restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fred::error::Error as FredError;
use fred::interfaces::{FunctionInterface, LuaInterface};
use fred::prelude::Client;
use fred::types::Value;
use fred::types::scripts::Script;

use super::{CLUSTER_SCRIPT, LIBRARY_BODY, SCRIPT};
use crate::store::StoreError;

/// How long calls go by EVALSHA after the server refused functions, before they are tried again.
const FUNCTIONS_RETRY: Duration = Duration::from_secs(60);

/// The decision script in its two forms, and which one this store calls.
#[derive(Debug)]
pub(super) struct DecisionScript {
    /// Whether calls go by FCALL: until the server refuses functions, and again [`FUNCTIONS_RETRY`] after.
    functions: AtomicBool,
    /// When the server last refused functions, in milliseconds after `epoch`.
    refused_ms: AtomicU64,
    epoch: Instant,
    /// Whether the refusal was told with a warning (once: the tries after it are told at debug level).
    warned: AtomicBool,
    /// EVALSHA's first argument: [`SCRIPT`]'s SHA1 (or [`CLUSTER_SCRIPT`]'s).
    sha: Value,
    /// FCALL's first argument: the library's one function, named as the library.
    function: Value,
    /// What SCRIPT LOAD loads.
    script: &'static str,
    /// What FUNCTION LOAD loads: the same definitions, and the entry registered as the function.
    library: String,
}

impl DecisionScript {
    /// The decision script for one server (standalone or Sentinel), or for a cluster's nodes (`clustered`: declaring
    /// the flag `allow-cross-slot-keys`, see [`CLUSTER_SCRIPT`]).
    pub(super) fn new(clustered: bool) -> DecisionScript {
        let script = if clustered { CLUSTER_SCRIPT } else { SCRIPT };
        let sha = Script::from_lua(script).sha1().clone();
        let name = format!("sluice_{}", &sha[..16]);
        let flags = if clustered {
            ", flags = { 'allow-cross-slot-keys' }"
        } else {
            ""
        };
        let library = format!(
            "#!lua name={name}\nlocal KEYS, ARGV\n{LIBRARY_BODY}\nredis.register_function{{ function_name = '{name}', \
             callback = function(keys, argv) KEYS, ARGV = keys, argv return batch() end{flags} }}\n"
        );
        DecisionScript {
            functions: AtomicBool::new(true),
            refused_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            warned: AtomicBool::new(false),
            sha: Value::from(sha),
            function: Value::from(name),
            script,
            library,
        }
    }

    /// The command a call is sent as, and its first argument (the function's name or the script's SHA1); the rest
    /// (the number of keys, the keys, the arguments) is the same for both.
    pub(super) fn command(&self) -> (&'static str, Value) {
        self.command_at(Instant::now())
    }

    /// [`command`](DecisionScript::command) at `now`: by EVALSHA for [`FUNCTIONS_RETRY`] after the server refused
    /// functions, then by FCALL again.
    fn command_at(&self, now: Instant) -> (&'static str, Value) {
        if !self.functions.load(Ordering::Relaxed) {
            let since = now.saturating_duration_since(self.epoch);
            let retry = self.refused_ms.load(Ordering::Relaxed) + FUNCTIONS_RETRY.as_millis() as u64;
            if since.as_millis() as u64 >= retry {
                self.functions.store(true, Ordering::Relaxed);
            }
        }
        if self.functions.load(Ordering::Relaxed) {
            ("FCALL", self.function.clone())
        } else {
            ("EVALSHA", self.sha.clone())
        }
    }

    /// Tries functions again at the next call, as [`FUNCTIONS_RETRY`] after a refusal (tests).
    #[cfg(test)]
    pub(super) fn try_functions_again(&self) {
        self.functions.store(true, Ordering::Relaxed);
    }

    /// Whether a call failed because the server lacks what it named, and may be sent again once [`load`] ran: the
    /// script unknown (NOSCRIPT: after a restart, a failover or `SCRIPT FLUSH`), the function unknown (the same, or
    /// `FUNCTION FLUSH`), or FCALL refused. A refused FCALL turns calls to EVALSHA here, as a refused FUNCTION LOAD
    /// does in [`load`]: a user allowed `function|load` but not `fcall` would otherwise load the library and be
    /// refused again at every call.
    ///
    /// [`load`]: DecisionScript::load
    pub(super) fn is_missing(&self, e: &FredError) -> bool {
        let details = e.details();
        if refuses(details, "fcall") {
            self.refused(details);
            return true;
        }
        details.starts_with("NOSCRIPT") || details.contains("Function not found")
    }

    /// The server refused functions (`details`: how): calls go by EVALSHA for [`FUNCTIONS_RETRY`], told with a
    /// warning the first time.
    fn refused(&self, details: &str) {
        let since = self.epoch.elapsed().as_millis() as u64;
        self.refused_ms.store(since, Ordering::Relaxed);
        if self.functions.swap(false, Ordering::Relaxed) && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %details,
                "the redis server refuses functions; the decision script runs by EVALSHA, which makes its \
                 definitions again at every call (functions are tried again every minute)"
            );
        } else {
            tracing::debug!(error = %details, "the redis server still refuses functions");
        }
    }

    /// Loads the script on the server `client` talks to: the library, or, where the server refuses functions, the
    /// script (and calls go by EVALSHA from then on). Loading the library again replaces it with the same code, so
    /// instances that meet a missing function together may all load it.
    pub(super) async fn load(&self, client: &Client) -> Result<(), FredError> {
        if self.functions.load(Ordering::Relaxed) {
            let loaded: Result<Value, FredError> = client.function_load(true, self.library.as_str()).await;
            match loaded {
                Ok(_) => return Ok(()),
                Err(e) if refuses(e.details(), "function") => self.refused(e.details()),
                Err(e) => return Err(e),
            }
        }
        let loaded: Result<String, FredError> = client.script_load(self.script).await;
        loaded.map(drop)
    }
}

/// Whether `details`, an error's, is the server refusing the command `command` (case aside): unknown to it (Redis
/// The decision script's loads after calls found it missing, one in flight at a time per store: the calls that did
/// together (every call in flight when the server lost its scripts) wait for one load per server rather than
/// send one each, and share its outcome, a failure included (so a server that does not answer costs each waiting
/// call the one load's timeout, not one after the other's).
#[derive(Default)]
pub(super) struct ScriptLoads {
    /// Loads ended, all servers together: a call reads it before it is sent.
    clock: AtomicU64,
    /// Per server (its address; `""` for the one server outside a cluster), the value of `clock` its last load ended
    /// at, and how it ended. Held across a load, so that calls that meet NOSCRIPT meanwhile wait for it; a load
    /// dropped half-way releases it unrecorded, and the next caller loads.
    ended: tokio::sync::Mutex<HashMap<Arc<str>, LoadEnded>>,
}

/// When a load ended (the value of [`ScriptLoads::clock`] it left) and how.
type LoadEnded = (u64, Result<(), StoreError>);

impl ScriptLoads {
    /// The value to give [`ScriptLoads::load`] for calls sent after this moment.
    pub(super) fn now(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Runs `load` on every server of `servers` (address, what loads there) unless a load there ended since `sent`
    /// (see [`ScriptLoads::now`]), whose outcome then stands for this one; one load at a time per store.
    pub(super) async fn load<P, F>(
        &self,
        sent: u64,
        servers: Vec<(Arc<str>, P)>,
        load: impl Fn(P) -> F,
    ) -> Result<(), StoreError>
    where
        F: std::future::Future<Output = Result<(), StoreError>>,
    {
        let mut ended = self.ended.lock().await;
        for (addr, server) in servers {
            let outcome = match ended.get(&addr) {
                Some((at, outcome)) if *at > sent => outcome.clone(),
                _ => {
                    let outcome = load(server).await;
                    let at = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
                    ended.insert(addr, (at, outcome.clone()));
                    outcome
                }
            };
            outcome?;
        }
        Ok(())
    }
}

/// before 7), or not allowed to this user (ACL).
fn refuses(details: &str, command: &str) -> bool {
    let lower = details.to_ascii_lowercase();
    (lower.starts_with("noperm") || lower.starts_with("err unknown command") || lower.starts_with("unknown command"))
        && lower.contains(&format!("'{command}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_or_unknown_command_is_told_from_other_errors() {
        assert!(refuses(
            "NOPERM User sluice has no permissions to run the 'fcall' command",
            "fcall"
        ));
        assert!(refuses(
            "ERR unknown command 'FCALL', with args beginning with: 'sluice_0'",
            "fcall"
        ));
        assert!(refuses(
            "NOPERM User sluice has no permissions to run the 'function|load' command",
            "function"
        ));
        assert!(refuses(
            "ERR unknown command 'FUNCTION', with args beginning with: 'LOAD'",
            "function"
        ));
        assert!(!refuses(
            "NOPERM User sluice has no permissions to access the 'x' key",
            "fcall"
        ));
        assert!(!refuses("ERR Error compiling function", "function"));
        assert!(!refuses(
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "fcall"
        ));
    }

    #[test]
    fn the_library_is_named_by_the_script_and_flagged_in_a_cluster() {
        let one = DecisionScript::new(false);
        let cluster = DecisionScript::new(true);
        let name = |s: &DecisionScript| s.function.as_str().unwrap().to_string();
        assert_ne!(name(&one), name(&cluster));
        assert!(name(&one).starts_with("sluice_") && name(&one).len() == 23);
        assert!(one.library.starts_with(&format!("#!lua name={}\n", name(&one))));
        assert!(cluster.library.contains("flags = { 'allow-cross-slot-keys' }"));
        assert!(!one.library.contains("flags = {"));
        assert_eq!(one.command().0, "FCALL");
        one.functions.store(false, Ordering::Relaxed);
        assert_eq!(one.command(), ("EVALSHA", one.sha.clone()));
    }

    #[test]
    fn functions_are_tried_again_a_minute_after_a_refusal() {
        let script = DecisionScript::new(false);
        script.refused_ms.store(5_000, Ordering::Relaxed);
        script.functions.store(false, Ordering::Relaxed);
        let at = |ms: u64| script.command_at(script.epoch + Duration::from_millis(ms)).0;
        assert_eq!(at(5_000), "EVALSHA");
        assert_eq!(at(64_999), "EVALSHA");
        assert_eq!(at(65_000), "FCALL");
        assert_eq!(at(65_001), "FCALL", "until the server refuses them again");
    }
}
