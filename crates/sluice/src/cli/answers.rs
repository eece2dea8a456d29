//! What a decision's answer carries: OK whatever the limits say (shadow mode), the rules' metadata, and the rate
//! limit headers with the names of the legacy set.

use clap::Args;

use crate::faces::headers::{self, HeaderMode, LegacyNames, ResponseHeaders};

/// `serve`'s flags for the answers.
#[derive(Debug, Args)]
pub(super) struct AnswerFlags {
    /// Answer OK whatever the limits say (statuses still report OVER_LIMIT).
    #[arg(long, env = "SLUICE_SHADOW_MODE")]
    pub(super) shadow_mode: bool,
    /// Merge the `metadata` of the rules that passed into the response's dynamic_metadata.
    #[arg(long, env = "SLUICE_RESPONSE_METADATA")]
    pub(super) response_metadata: bool,
    /// Rate limit headers to add to responses (response_headers_to_add), for the most constrained status.
    #[arg(long, env = "SLUICE_RESPONSE_HEADERS", value_enum, default_value = "off")]
    pub(super) response_headers: HeaderMode,
    /// Name of the legacy limit header (--response-headers legacy or both).
    #[arg(long, env = "SLUICE_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = headers::check_name)]
    pub(super) limit_header: String,
    /// Name of the legacy remaining header.
    #[arg(long, env = "SLUICE_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = headers::check_name)]
    pub(super) remaining_header: String,
    /// Name of the legacy reset header.
    #[arg(long, env = "SLUICE_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = headers::check_name)]
    pub(super) reset_header: String,
}

impl AnswerFlags {
    /// The rate limit headers to add, and the names of the legacy set.
    pub(super) fn headers(&self) -> ResponseHeaders {
        ResponseHeaders {
            mode: self.response_headers,
            names: LegacyNames {
                limit: self.limit_header.clone().into(),
                remaining: self.remaining_header.clone().into(),
                reset: self.reset_header.clone().into(),
            },
        }
    }
}
