//! The wire conversions the faces share: a `RateLimitRequest`'s parts into the core's request, a decision into a
//! `RateLimitResponse` (which the JSON API prints as JSON), and the byte cap every face applies to a request. The gRPC
//! services and the JSON API answer alike because they convert through here.

use std::sync::Arc;

use prost_types::{ListValue, Struct, Value, value::Kind};

use crate::faces::headers::ResponseHeaders;
use crate::limiter::{self, AppliedLimit, Cap, Code, Decision, LimitError, Limiter};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::rules::{Metadata, Unit};
use crate::store::{Announcements, Counters};

use rls::rate_limit_response::{Code as PbCode, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit};

/// Moves the request's strings into the core's types without copying them.
pub fn to_core(domain: String, descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> limiter::Request {
    limiter::Request {
        domain,
        hits_addend,
        descriptors: descriptors
            .into_iter()
            .map(|d| limiter::Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit_override: d.limit.map(|o| limiter::Override {
                    requests_per_unit: o.requests_per_unit,
                    unit: o.unit,
                }),
                hits_addend: d.hits_addend,
            })
            .collect(),
    }
}

/// The protobuf response for a decision, with the rate limit headers `headers` asks for.
pub fn to_response(decision: Decision, headers: &ResponseHeaders) -> rls::RateLimitResponse {
    let dynamic_metadata = dynamic_metadata(&decision);
    let response_headers_to_add = crate::faces::headers::for_decision(headers, &decision)
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_string(),
            value,
            raw_value: Vec::new(),
        })
        .collect();
    rls::RateLimitResponse {
        overall_code: code(decision.overall) as i32,
        statuses: decision
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.code) as i32,
                current_limit: s.limit.map(current_limit),
                limit_remaining: s.remaining,
                duration_until_reset: s.reset_after_us.map(whole_seconds),
                quota: None,
            })
            .collect(),
        dynamic_metadata,
        response_headers_to_add,
        ..Default::default()
    }
}

/// The response's `dynamic_metadata`: the passing rules' `metadata` (when switched on), and under `sluice` what the
/// caller needs to hand back or to find its work: `lease_id` for `Release`, and `queued` entries
/// (`{descriptor, stream, entry_id}`) appended to `queue` limits.
fn dynamic_metadata(decision: &Decision) -> Option<Struct> {
    let mut merged = merge_metadata(&decision.metadata);
    if decision.lease.is_none() && decision.queued.is_empty() {
        return merged;
    }
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let mut fields = std::collections::BTreeMap::new();
    if let Some(lease) = &decision.lease {
        fields.insert("lease_id".to_string(), text(lease));
    }
    if !decision.queued.is_empty() {
        let entries = decision
            .queued
            .iter()
            .map(|q| Value {
                kind: Some(Kind::StructValue(Struct {
                    fields: [
                        (
                            "descriptor".to_string(),
                            Value {
                                kind: Some(Kind::NumberValue(q.descriptor as f64)),
                            },
                        ),
                        ("stream".to_string(), text(&q.stream)),
                        ("entry_id".to_string(), text(&q.entry_id)),
                    ]
                    .into_iter()
                    .collect(),
                })),
            })
            .collect();
        fields.insert(
            "queued".to_string(),
            Value {
                kind: Some(Kind::ListValue(ListValue { values: entries })),
            },
        );
    }
    let sluice = Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    };
    merged
        .get_or_insert_with(Struct::default)
        .fields
        .insert("sluice".to_string(), sluice);
    merged
}

/// A decision's code as the protobuf enum.
fn code(code: Code) -> PbCode {
    match code {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    }
}

/// A rule's unit as the protobuf enum.
pub fn unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

/// The limit a status applied, as Envoy's `current_limit`.
fn current_limit(applied: AppliedLimit) -> RateLimit {
    RateLimit {
        name: applied.name.as_deref().unwrap_or_default().to_string(),
        requests_per_unit: applied.limit.requests,
        unit: unit(applied.limit.unit) as i32,
    }
}

/// Envoy's status reports whole seconds, rounded up, so a live window never reads as 0 (as the reference does).
fn whole_seconds(us: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: us.div_ceil(1_000_000).max(1) as i64,
        nanos: 0,
    }
}

/// Merges rule metadata maps into one `Struct`; a later rule's key wins.
fn merge_metadata(maps: &[Arc<Metadata>]) -> Option<Struct> {
    if maps.is_empty() {
        return None;
    }
    let mut merged = Struct::default();
    for map in maps {
        merged
            .fields
            .extend(map.iter().map(|(k, v)| (k.clone(), Value { kind: Some(kind(v)) })));
    }
    Some(merged)
}

/// A rule's metadata value (JSON) as a protobuf `Value`'s kind.
fn kind(v: &serde_json::Value) -> Kind {
    use serde_json::Value as J;
    match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(|i| Value { kind: Some(kind(i)) }).collect(),
        }),
        J::Object(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), Value { kind: Some(kind(v)) }))
                .collect(),
        }),
    }
}

/// The byte cap every face applies to a request (`--max-request-bytes`): gRPC to the encoded message, the JSON API to
/// the body. A request over it is counted as invalid and refused, naming the cap.
pub fn check_request_bytes<S: Counters + Announcements>(limiter: &Limiter<S>, len: usize) -> Result<(), LimitError> {
    let cap = limiter.settings().caps.max_request_bytes;
    if len > cap {
        limiter.metrics().invalid_request("any");
        return Err(LimitError::OverCap {
            cap: Cap::RequestBytes,
            message: format!("request is {len} bytes, over the cap of {cap}"),
        });
    }
    Ok(())
}
