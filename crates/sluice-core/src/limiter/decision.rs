//! What the decision core answers: a decision per request with a status per descriptor, GetRemaining's reports,
//! what Reset did, and why a request got no answer.

use std::sync::Arc;

use super::settings::Cap;
use crate::rules::{FailurePolicy, Limit, Tier};
use crate::store::StoreError;

/// The answer for a request or a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    pub limit: Limit,
    pub name: Option<Arc<str>>,
}

impl From<&Tier> for AppliedLimit {
    fn from(tier: &Tier) -> Self {
        AppliedLimit {
            limit: tier.limit,
            name: tier.name.clone(),
        }
    }
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// Set whenever a finite limit applied.
    pub limit: Option<AppliedLimit>,
    /// Hits left in the window; `u32::MAX` for an unlimited rule, 0 when no rule applied.
    pub remaining: u32,
    /// In microseconds, set whenever a finite limit applied: for an admitted hit, the time until the counter resets
    /// (is full again); for a denied one, the wait until the same hit would be admitted (the time until the
    /// counter resets when the cost can never fit).
    pub reset_after_us: Option<u64>,
}

impl Status {
    pub(crate) const NO_RULE: Status = Status {
        code: Code::Ok,
        limit: None,
        remaining: 0,
        reset_after_us: None,
    };
    /// A descriptor a deny list matched: over the limit, no limit applied.
    pub(crate) const LISTED_DENY: Status = Status {
        code: Code::OverLimit,
        limit: None,
        remaining: 0,
        reset_after_us: None,
    };
    pub(crate) const UNLIMITED: Status = Status {
        code: Code::Ok,
        limit: None,
        remaining: u32::MAX,
        reset_after_us: None,
    };
}

/// The answer for a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub overall: Code,
    /// One per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// The `metadata` of the rules whose descriptors passed, when response metadata is on.
    pub metadata: Vec<Arc<crate::rules::Metadata>>,
    /// The lease this request holds in `concurrency` limits, to hand back with `Release`.
    pub lease: Option<String>,
    /// The entries this request appended to `queue` limits.
    pub queued: Vec<Queued>,
    /// The deny and allow lists that decided descriptors of this request, each once, by action and name.
    pub lists: Vec<(crate::rules::ListAction, std::sync::Arc<str>)>,
}

/// An entry appended to a `queue` limit's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The request descriptor's index.
    pub descriptor: usize,
    /// The stream's key, where workers read.
    pub stream: String,
    pub entry_id: String,
}

/// What GetRemaining reports for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    NoRule,
    Unlimited,
    Limited {
        /// The most constrained limit.
        limit: AppliedLimit,
        /// What is left of it now.
        remaining: u64,
        /// Time until it is full again, in microseconds.
        reset_after_us: u64,
        /// Time until a hit of the asked cost fits every limit; `None`: never.
        retry_after_us: Option<u64>,
        /// Recorded entry values, newest first (`record`).
        records: Vec<String>,
    },
}

/// What Reset does with a `queue` limit's stream that still holds entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuedWork {
    /// Keep the stream and report it: workers may still be due to process its entries.
    Keep,
    /// Delete it with the rest, abandoning the waiting entries.
    Drop,
}

/// What a Reset did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResetReport {
    /// Stored states that existed and were deleted.
    pub deleted: u64,
    /// The `queue` streams kept because entries still wait in them.
    pub kept_streams: Vec<String>,
}

/// Why a request got no decision.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// The request itself is malformed; the message names what is wrong.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request exceeds one of the [`Caps`](super::Caps); the message names the field and says by how much, and `cap` which
    /// setting bounds it (a face names it as its users set it: the service, by its flag).
    #[error("{message} ({})", cap.setting())]
    OverCap { cap: Cap, message: String },
    /// What the call names (a domain, a list) does not exist; the message says which.
    #[error("{0}")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The instance is at a bound of concurrent work (calls waiting for a permit); the message says which.
    #[error("{0}")]
    Busy(String),
}

/// The status a failure policy gives a limited descriptor when the store could not decide.
pub fn fallback_status(policy: FailurePolicy, tier: &Tier, shadow: bool) -> Status {
    match policy {
        FailurePolicy::FailClosed => Status {
            code: if shadow { Code::Ok } else { Code::OverLimit },
            limit: Some(AppliedLimit::from(tier)),
            remaining: 0,
            reset_after_us: Some(1_000_000),
        },
        FailurePolicy::FailOpen | FailurePolicy::Error => Status::NO_RULE,
    }
}
