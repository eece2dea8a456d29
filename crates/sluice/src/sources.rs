//! Where the rules come from, each compiled by the core and swapped in whole; a bad source never replaces a good
//! rule set.
//!
//! - [`reload`]: configuration files, watched (symlinks followed) and reloaded on change or SIGHUP.
//! - [`xds`]: an xDS management server (Envoy Gateway) pushing `RateLimitConfig` snapshots, ACKed or NACKed.
//! - [`lists`]: the values of lists that name a URL, fetched at start and again on their interval.

pub mod lists;
pub mod reload;
pub mod xds;
