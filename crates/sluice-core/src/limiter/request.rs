//! What a request to the decision core is: a domain and its descriptors, as Envoy sends them, and the checks every
//! request passes before it is decided (Envoy's protocol, and the [`Caps`]).

use super::decision::LimitError;
use super::settings::{Cap, Caps};
use crate::rules::Unit;

/// A rate limit request, as Envoy sends it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// The cost of each descriptor's hit; 0 means 1.
    pub hits_addend: u32,
}

/// One descriptor of a request: ordered entries, an optional limit override and an optional own cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    pub limit_override: Option<Override>,
    /// Overrides the request's `hits_addend`; `Some(0)` checks without consuming.
    pub hits_addend: Option<u64>,
}

/// A `RateLimitOverride` as received: `unit` is the raw `envoy.type.v3.RateLimitUnit` number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Override {
    pub requests_per_unit: u32,
    pub unit: i32,
}

/// The costs of a cost-budget call (and of a wait's check).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    /// The cost of each descriptor, unless the descriptor sets its own `hits_addend`.
    pub cost: u64,
    /// Named costs, e.g. `input_tokens`: limits configured with `cost:` or `price:` count these.
    pub named: Vec<(String, u64)>,
}

/// The cost of a descriptor's hit: its own `hits_addend` if present (0 = check only), else the request's, 0 = 1.
pub fn cost(request: &Request, descriptor: &Descriptor) -> u64 {
    descriptor.hits_addend.unwrap_or(u64::from(request.hits_addend.max(1)))
}

/// Rejects what Envoy's protocol forbids and what exceeds the caps, naming the offending field or cap.
pub fn validate(request: &Request, caps: &Caps) -> Result<(), LimitError> {
    let invalid = |m: String| Err(LimitError::InvalidArgument(m));
    let over = |cap: Cap, message: String| Err(LimitError::OverCap { cap, message });
    if request.domain.is_empty() {
        return invalid("domain is empty".into());
    }
    if request.domain.len() > caps.max_value_bytes {
        return over(
            Cap::ValueBytes,
            format!(
                "domain is {} bytes, over the cap of {}",
                request.domain.len(),
                caps.max_value_bytes
            ),
        );
    }
    if request.descriptors.is_empty() {
        return invalid("no descriptors".into());
    }
    if request.descriptors.len() > caps.max_descriptors {
        return over(
            Cap::Descriptors,
            format!(
                "{} descriptors, over the cap of {}",
                request.descriptors.len(),
                caps.max_descriptors
            ),
        );
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return invalid(format!("descriptors[{i}] has no entries"));
        }
        if d.entries.len() > caps.max_entries {
            return over(
                Cap::Entries,
                format!(
                    "descriptors[{i}] has {} entries, over the cap of {}",
                    d.entries.len(),
                    caps.max_entries
                ),
            );
        }
        for (j, (k, v)) in d.entries.iter().enumerate() {
            if k.is_empty() {
                return invalid(format!("descriptors[{i}].entries[{j}].key is empty"));
            }
            if k.len() > caps.max_value_bytes || v.len() > caps.max_value_bytes {
                return over(
                    Cap::ValueBytes,
                    format!(
                        "descriptors[{i}].entries[{j}] is over the cap of {} bytes per key or value",
                        caps.max_value_bytes
                    ),
                );
            }
        }
        if let Some(o) = d.limit_override {
            if Unit::from_override(o.unit).is_none() {
                return invalid(format!(
                    "descriptors[{i}].limit.unit {} is not a valid unit (SECOND to YEAR)",
                    o.unit
                ));
            }
        }
    }
    Ok(())
}
