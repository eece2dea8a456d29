//! The bounds on what one client may ask: a request's descriptors, entries and bytes (the same on every face and
//! RPC), the calls waiting for a permit, and the RLQS streams and their buckets.

use clap::Args;

use crate::limiter::Caps;
use crate::quota::QuotaCaps;

/// `serve`'s flags for the caps.
#[derive(Debug, Args)]
pub(super) struct CapFlags {
    /// Most descriptors in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(super) max_descriptors: u64,
    /// Most entries in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(super) max_entries: u64,
    /// Most bytes in one entry key or value, or in the domain.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", default_value_t = 4_096, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub(super) max_value_bytes: u64,
    /// Most bytes in one encoded request.
    #[arg(long, env = "SLUICE_MAX_REQUEST_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(64..=4_194_304))]
    pub(super) max_request_bytes: u64,
    /// Most calls waiting for a permit at once (sluice.v1 WaitForPermit); past it a call is refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "SLUICE_MAX_WAITERS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(super) max_waiters: u64,
    /// Most RLQS streams open at once (Envoy's rate limit quota filter keeps one per Envoy and filter config).
    #[arg(long, env = "SLUICE_RLQS_MAX_STREAMS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(super) rlqs_max_streams: u64,
    /// Most buckets one RLQS stream may report.
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKETS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(super) rlqs_max_buckets: u64,
}

impl CapFlags {
    /// The caps on a request.
    pub(super) fn request(&self) -> Caps {
        Caps {
            max_descriptors: self.max_descriptors as usize,
            max_entries: self.max_entries as usize,
            max_value_bytes: self.max_value_bytes as usize,
            max_request_bytes: self.max_request_bytes as usize,
        }
    }

    /// The caps on the RLQS streams.
    pub(super) fn quota(&self) -> QuotaCaps {
        QuotaCaps {
            max_streams: self.rlqs_max_streams as usize,
            max_buckets_per_stream: self.rlqs_max_buckets as usize,
            max_value_bytes: self.max_value_bytes as usize,
        }
    }
}
