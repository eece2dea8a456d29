//! Hot reload: watches the configuration and swaps in a new rule set when it changes, or on SIGHUP.
//!
//! The watch is on the directory that holds the configuration (the file's parent, or the directory itself), so it
//! sees in-place writes, atomic renames (`mv tmp file`, `sed -i`) and the Kubernetes ConfigMap symlink swap alike,
//! and on the directory of every symlink on the way to it, so that swapping a symlinked directory (the reference's
//! runtime layout, `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY` with either one a symlink) is seen too. The watches are set
//! again after every change, so they follow the directories the symlinks now point to.
//! Events are debounced, and a reload whose files hash to the rule set in force is skipped. A configuration that
//! does not load (bad YAML, an invalid rule, a file caught empty mid-write) never replaces the running one: the
//! reason is logged and counted. In-flight requests finish with the rules they started with, and counters survive:
//! their keys depend only on the domain, the entries, the algorithm and the window.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config;
use crate::limiter::Limiter;
use crate::rules::{Domains, RuleSet};
use crate::store::{Announcements, Counters};

/// How long the configuration must be quiet after a change before it is read: editors and `kubectl` write in
/// several steps.
pub const DEBOUNCE: Duration = Duration::from_millis(250);

/// A running watcher; dropping it stops watching.
pub struct Reloader {
    task: JoinHandle<()>,
}

impl Drop for Reloader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why watching could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch '{}' for changes: {source}", path.display())]
pub struct WatchError {
    path: PathBuf,
    source: notify::Error,
}

impl Reloader {
    /// Starts watching `path` (the `--config` file or directory) and reloading `limiter` from it, merging files of
    /// one domain as `domains` says.
    pub fn start<S: Counters + Announcements>(
        limiter: Arc<Limiter<S>>,
        path: PathBuf,
        domains: Domains,
    ) -> Result<Reloader, WatchError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok_and(|e| !e.kind.is_access()) {
                let _ = tx.send(());
            }
        })
        .map_err(|source| WatchError {
            path: path.clone(),
            source,
        })?;
        let mut watches = Watches {
            watcher,
            dirs: Vec::new(),
        };
        watches.follow(&path)?;
        let task = tokio::spawn(run(limiter, path, domains, watches, rx));
        Ok(Reloader { task })
    }
}

/// The watcher and the directories it watches.
struct Watches {
    watcher: RecommendedWatcher,
    /// Each watched directory, with the directory it resolved to when the watch was set.
    dirs: Vec<(PathBuf, Option<PathBuf>)>,
}

impl Watches {
    /// Watches the directories that `path` goes through now, and no others. When they resolve as they did (an edit,
    /// not a swap), the watches stay as they are, so no event can fall between an old watch and a new one.
    fn follow(&mut self, path: &Path) -> Result<(), WatchError> {
        let now: Vec<_> = watched_dirs(path)
            .into_iter()
            .map(|dir| {
                let resolved = std::fs::canonicalize(&dir).ok();
                (dir, resolved)
            })
            .collect();
        if now == self.dirs {
            return Ok(());
        }
        for (dir, _) in self.dirs.drain(..) {
            let _ = self.watcher.unwatch(&dir);
        }
        for (dir, resolved) in now {
            self.watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|source| WatchError {
                    path: dir.clone(),
                    source,
                })?;
            self.dirs.push((dir, resolved));
        }
        Ok(())
    }
}

/// The directory of the configuration, then the directory of each symlink on the way to it.
fn watched_dirs(path: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![watched_dir(path)];
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for step in absolute.ancestors() {
        let is_link = std::fs::symlink_metadata(step).is_ok_and(|m| m.file_type().is_symlink());
        if let (true, Some(parent)) = (is_link, step.parent())
            && !dirs.iter().any(|d| d == parent)
        {
            dirs.push(parent.to_path_buf());
        }
    }
    dirs
}

/// The directory whose entries change when the configuration does.
fn watched_dir(path: &Path) -> PathBuf {
    if path.is_dir() {
        return path.to_path_buf();
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

async fn run<S: Counters + Announcements>(
    limiter: Arc<Limiter<S>>,
    path: PathBuf,
    domains: Domains,
    mut watches: Watches,
    mut events: mpsc::UnboundedReceiver<()>,
) {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let by_signal = tokio::select! {
            event = events.recv() => {
                if event.is_none() {
                    return;
                }
                // Wait for quiet: every further event restarts the wait.
                while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, events.recv()).await {}
                false
            }
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        reload(&limiter, &path, domains, by_signal);
        if let Err(e) = watches.follow(&path) {
            tracing::warn!(error = %e, "configuration changes may go unseen until the next SIGHUP");
        }
    }
}

/// What to call on the thread that loaded a configuration, once the rules it replaced are dropped: `sluice serve`
/// sets it to hand back to the system the memory its allocator keeps after a large load. Set once, before serving.
pub static AFTER_LOAD: OnceLock<fn()> = OnceLock::new();

/// Calls [`AFTER_LOAD`], if it is set.
pub(crate) fn after_load() {
    if let Some(release) = AFTER_LOAD.get() {
        release();
    }
}

/// Loads and compiles the configuration; swaps it in when it is valid and different. Returns whether it did.
pub fn reload<S: Counters + Announcements>(limiter: &Limiter<S>, path: &Path, domains: Domains, forced: bool) -> bool {
    let metrics = limiter.metrics();
    let compiled = config::load(path).and_then(|files| RuleSet::compile_owned(files, metrics, domains));
    match compiled {
        Ok(rules) if !forced && rules.digest() == limiter.rules().digest() => false,
        Ok(rules) => {
            let digest = rules.digest();
            tracing::info!(
                config = %path.display(),
                summary = %rules.headline(),
                digest = format!("{digest:016x}"),
                "configuration reloaded"
            );
            limiter.reload(rules);
            after_load();
            metrics.config_reload(Ok(digest));
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "configuration not reloaded; the previous one stays in force");
            metrics.config_reload(Err(()));
            false
        }
    }
}
