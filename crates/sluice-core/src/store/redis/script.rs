//! How the decision script is called: as a Redis function where the server allows it (Redis 7 or later, `FUNCTION
//! LOAD` once per server, then `FCALL`), else by EVALSHA. The script defines some fifty functions and a dozen tables
//! before it decides anything; run by EVALSHA it makes them again at every call (about 10 µs of Redis's time, more
//! than deciding a batch of a dozen descriptors), where a function library makes them once, when it is loaded.
//!
//! The library is named by the script's SHA1 (`sluice_<16 hex digits>`), so instances of two versions sharing a Redis
//! during an upgrade each call their own. A server that refuses functions (Redis 6: unknown command; an ACL without
//! `fcall` and `function|load`: NOPERM) turns this store to EVALSHA for good, with one warning: the answers are the
//! same, only the cost differs.

use std::sync::atomic::{AtomicBool, Ordering};

use fred::error::Error as FredError;
use fred::interfaces::{FunctionInterface, LuaInterface};
use fred::prelude::Client;
use fred::types::Value;
use fred::types::scripts::Script;

use super::{CLUSTER_SCRIPT, LIBRARY_BODY, SCRIPT};

/// The decision script in its two forms, and which one this store calls.
#[derive(Debug)]
pub(super) struct DecisionScript {
    /// Whether calls go by FCALL: until the server refuses functions.
    functions: AtomicBool,
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
            sha: Value::from(sha),
            function: Value::from(name),
            script,
            library,
        }
    }

    /// The command a call is sent as, and its first argument (the function's name or the script's SHA1); the rest
    /// (the number of keys, the keys, the arguments) is the same for both.
    pub(super) fn command(&self) -> (&'static str, Value) {
        if self.functions.load(Ordering::Relaxed) {
            ("FCALL", self.function.clone())
        } else {
            ("EVALSHA", self.sha.clone())
        }
    }

    /// Whether a call failed because the server lacks what it named, and may be sent again once [`load`] ran: the
    /// script unknown (NOSCRIPT: after a restart, a failover or `SCRIPT FLUSH`), the function unknown (the same, or
    /// `FUNCTION FLUSH`), or FCALL refused (which [`load`] answers by turning to EVALSHA).
    ///
    /// [`load`]: DecisionScript::load
    pub(super) fn is_missing(&self, e: &FredError) -> bool {
        let details = e.details();
        details.starts_with("NOSCRIPT") || details.contains("Function not found") || refuses(details, "fcall")
    }

    /// Loads the script on the server `client` talks to: the library, or, where the server refuses functions, the
    /// script (and calls go by EVALSHA from then on). Loading the library again replaces it with the same code, so
    /// instances that meet a missing function together may all load it.
    pub(super) async fn load(&self, client: &Client) -> Result<(), FredError> {
        if self.functions.load(Ordering::Relaxed) {
            let loaded: Result<Value, FredError> = client.function_load(true, self.library.as_str()).await;
            match loaded {
                Ok(_) => return Ok(()),
                Err(e) if refuses(e.details(), "function") => {
                    if self.functions.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            error = %e.details(),
                            "the redis server refuses functions; the decision script runs by EVALSHA, which makes \
                             its definitions again at every call"
                        );
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let loaded: Result<String, FredError> = client.script_load(self.script).await;
        loaded.map(drop)
    }
}

/// Whether `details`, an error's, is the server refusing the command `command` (case aside): unknown to it (Redis
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
}
