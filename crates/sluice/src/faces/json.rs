//! The proto3 JSON mapping of Envoy's `RateLimitRequest` and `RateLimitResponse`, for the HTTP `/json` endpoint.
//!
//! Requests accept the lowerCamelCase JSON names and the original field names, enums by name or number, and 64-bit
//! integers as numbers or strings, as proto3 JSON parsers do; unknown fields are errors naming their path. Responses
//! use the lowerCamelCase names, enum names and `"<seconds>s"` durations.

use serde_json::{Map, Value, json};

use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::envoy::r#type::v3::RateLimitUnit;

/// Parses a JSON `RateLimitRequest`; the error names the offending path.
pub fn request(value: &Value) -> Result<RateLimitRequest, String> {
    let fields = object(value, "request")?;
    let mut request = RateLimitRequest::default();
    for (name, v) in fields {
        match name.as_str() {
            "domain" => request.domain = string(v, "domain")?,
            "hitsAddend" | "hits_addend" => request.hits_addend = uint(v, "hitsAddend", u32::MAX.into())? as u32,
            "descriptors" => {
                for (i, d) in array(v, "descriptors")?.iter().enumerate() {
                    request.descriptors.push(descriptor(d, &format!("descriptors[{i}]"))?);
                }
            }
            other => return Err(format!("unknown field '{other}'")),
        }
    }
    Ok(request)
}

fn descriptor(value: &Value, path: &str) -> Result<RateLimitDescriptor, String> {
    let mut d = RateLimitDescriptor::default();
    for (name, v) in object(value, path)? {
        let at = |field: &str| format!("{path}.{field}");
        match name.as_str() {
            "entries" => {
                for (i, e) in array(v, &at("entries"))?.iter().enumerate() {
                    let here = format!("{path}.entries[{i}]");
                    let mut entry = Entry::default();
                    for (name, v) in object(e, &here)? {
                        match name.as_str() {
                            "key" => entry.key = string(v, &format!("{here}.key"))?,
                            "value" => entry.value = string(v, &format!("{here}.value"))?,
                            other => return Err(format!("{here}: unknown field '{other}'")),
                        }
                    }
                    d.entries.push(entry);
                }
            }
            "limit" => {
                let here = at("limit");
                let mut limit = RateLimitOverride::default();
                for (name, v) in object(v, &here)? {
                    match name.as_str() {
                        "requestsPerUnit" | "requests_per_unit" => {
                            limit.requests_per_unit =
                                uint(v, &format!("{here}.requestsPerUnit"), u32::MAX.into())? as u32
                        }
                        "unit" => limit.unit = unit(v, &format!("{here}.unit"))?,
                        other => return Err(format!("{here}: unknown field '{other}'")),
                    }
                }
                d.limit = Some(limit);
            }
            "hitsAddend" | "hits_addend" => d.hits_addend = Some(uint(v, &at("hitsAddend"), u64::MAX)?),
            other => return Err(format!("{path}: unknown field '{other}'")),
        }
    }
    Ok(d)
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, String> {
    value.as_object().ok_or_else(|| format!("{path}: expected an object"))
}

fn array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>, String> {
    value.as_array().ok_or_else(|| format!("{path}: expected an array"))
}

fn string(value: &Value, path: &str) -> Result<String, String> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{path}: expected a string"))
}

/// A non-negative integer, as a JSON number or a decimal string (proto3 JSON writes 64-bit integers as strings).
fn uint(value: &Value, path: &str, max: u64) -> Result<u64, String> {
    let n = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        Value::Object(o) => return uint(o.get("value").unwrap_or(&Value::Null), path, max),
        _ => None,
    };
    n.filter(|n| *n <= max)
        .ok_or_else(|| format!("{path}: expected an integer from 0 to {max}"))
}

fn unit(value: &Value, path: &str) -> Result<i32, String> {
    match value {
        Value::String(name) => RateLimitUnit::from_str_name(name)
            .map(|u| u as i32)
            .ok_or_else(|| format!("{path}: unknown unit '{name}'")),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| format!("{path}: expected a unit")),
        _ => Err(format!("{path}: expected a unit name")),
    }
}

/// Writes a `RateLimitResponse` as proto3 JSON (default values omitted, as proto3 JSON does).
pub fn response(response: &RateLimitResponse) -> Value {
    let code = |c: i32| Code::try_from(c).unwrap_or(Code::Unknown).as_str_name();
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code(response.overall_code)));
    let statuses: Vec<Value> = response.statuses.iter().map(|s| status(s, code(s.code))).collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    let headers: Vec<Value> = response
        .response_headers_to_add
        .iter()
        .map(|h| json!({"key": h.key, "value": h.value}))
        .collect();
    if !headers.is_empty() {
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), structure(metadata));
    }
    Value::Object(out)
}

fn status(s: &DescriptorStatus, code: &str) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code));
    if let Some(limit) = &s.current_limit {
        let mut l = Map::new();
        if !limit.name.is_empty() {
            l.insert("name".into(), json!(limit.name));
        }
        l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
        l.insert("unit".into(), json!(unit.as_str_name()));
        out.insert("currentLimit".into(), Value::Object(l));
    }
    if s.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(s.limit_remaining));
    }
    if let Some(d) = &s.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(format!("{}s", d.seconds)));
    }
    Value::Object(out)
}

fn structure(s: &prost_types::Struct) -> Value {
    Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect())
}

fn value(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_name_styles_and_rejects_unknown_fields() {
        let r = request(&json!({
            "domain": "edge",
            "hits_addend": 2,
            "descriptors": [
                {"entries": [{"key": "path", "value": "/x"}], "hitsAddend": "5",
                 "limit": {"requestsPerUnit": 3, "unit": "MINUTE"}},
                {"entries": [{"key": "user"}], "hits_addend": {"value": 0}}
            ]
        }))
        .unwrap();
        assert_eq!((r.domain.as_str(), r.hits_addend), ("edge", 2));
        assert_eq!(r.descriptors[0].hits_addend, Some(5));
        assert_eq!(r.descriptors[0].limit.unwrap().unit, RateLimitUnit::Minute as i32);
        assert_eq!(r.descriptors[1].hits_addend, Some(0));
        assert_eq!(r.descriptors[1].entries[0].value, "");
        let e =
            request(&json!({"domain": "d", "descriptors": [{"entries": [{"key": "a", "colour": 1}]}]})).unwrap_err();
        assert_eq!(e, "descriptors[0].entries[0]: unknown field 'colour'");
        let e = request(&json!({"domain": "d", "hitsAddend": -1})).unwrap_err();
        assert!(e.starts_with("hitsAddend: expected an integer"), "{e}");
        let e = request(&json!({"domain": "d", "descriptors": [{"limit": {"unit": "FORTNIGHT"}}]})).unwrap_err();
        assert_eq!(e, "descriptors[0].limit.unit: unknown unit 'FORTNIGHT'");
    }
}
