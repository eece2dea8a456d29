//! The `sluice` binary: the allocator, and the command line of [`sluice::cli`].

use std::process::ExitCode;

/// glibc's allocator spends a fifth of a decision's CPU time under load (measured with perf); mimalloc far less.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands back to the system the pages mimalloc keeps after they are freed: after loading a large configuration, a
/// thread that then idles would keep the memory of the parse and of the replaced rules resident.
fn release_freed_memory() {
    // SAFETY: mi_collect only returns memory that is free; it may be called at any time, from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

fn main() -> ExitCode {
    // Set once, before anything loads; only a server loads configurations more than once.
    let _ = sluice::sources::reload::AFTER_LOAD.set(release_freed_memory);
    sluice::cli::run(std::env::args_os().collect())
}
