//! The switches of the decision core: key prefix, shadow mode, failure policy, breaker, local cache and the caps on
//! requests.

use crate::breaker::BreakerSettings;
use crate::rules::FailurePolicy;
use crate::store::KeyLayout;

/// Switches of the decision core.
#[derive(Debug, Clone)]
pub struct LimiterSettings {
    /// Prefix of every counter key (no `{` or `}`).
    pub key_prefix: String,
    /// How the counters' keys are written (compact unless set; see [`KeyLayout`]).
    pub key_layout: KeyLayout,
    /// Global shadow mode: an overall OVER_LIMIT is answered OK; statuses keep OVER_LIMIT.
    pub shadow_mode: bool,
    /// Merge the `metadata` of passing rules into the response.
    pub response_metadata: bool,
    /// What to answer when the store fails, for domains that do not say.
    pub failure_policy: FailurePolicy,
    pub breaker: BreakerSettings,
    /// Denials remembered locally (0: none).
    pub local_cache_size: usize,
    pub caps: Caps,
    /// Calls that may wait for a permit at once (WaitForPermit); past it a call is refused at once.
    pub max_waiters: usize,
    /// Values kept per rule in each bucket of top offenders (hit most, denied most); 0 tracks none.
    pub top_offenders: usize,
}

/// One of the [`Caps`], as an over-cap error names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    Descriptors,
    Entries,
    ValueBytes,
    RequestBytes,
}

impl Cap {
    /// The name of the [`Caps`] field that sets it.
    pub fn setting(self) -> &'static str {
        match self {
            Cap::Descriptors => "max_descriptors",
            Cap::Entries => "max_entries",
            Cap::ValueBytes => "max_value_bytes",
            Cap::RequestBytes => "max_request_bytes",
        }
    }
}

/// Bounds on a request, each refused with INVALID_ARGUMENT naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub max_descriptors: usize,
    pub max_entries: usize,
    /// Bytes of one entry key or value (and of the domain).
    pub max_value_bytes: usize,
    /// Bytes of one encoded request (checked by the API, which sees the encoding).
    pub max_request_bytes: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            max_descriptors: 64,
            max_entries: 32,
            max_value_bytes: 4_096,
            max_request_bytes: 65_536,
        }
    }
}

impl Default for LimiterSettings {
    fn default() -> Self {
        LimiterSettings {
            key_prefix: "sluice:".to_string(),
            key_layout: KeyLayout::Compact,
            shadow_mode: false,
            response_metadata: false,
            failure_policy: FailurePolicy::Error,
            breaker: BreakerSettings::default(),
            local_cache_size: 100_000,
            caps: Caps::default(),
            max_waiters: 10_000,
            top_offenders: 100,
        }
    }
}
