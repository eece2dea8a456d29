//! How a scalar resolves, as YAML 1.2's core schema has it: null, booleans, integers (decimal, `0x`, `0o`, `0b`;
//! not `007`) and floats, for the fields that want them; and what a scalar is called in an error.

use std::borrow::Cow;

use saphyr_parser::{Event, ScalarStyle};
use serde::de::{self, Expected, Unexpected, Visitor};

use super::Error;

/// A plain scalar's text; `None` for quoted and block scalars and for collections.
pub(super) fn plain<'e>(event: &'e Event<'_>) -> Option<&'e str> {
    match event {
        Event::Scalar(text, ScalarStyle::Plain, ..) => Some(text),
        _ => None,
    }
}

pub(super) fn is_null(plain: &str) -> bool {
    matches!(plain, "" | "~" | "null" | "Null" | "NULL")
}

pub(super) fn parse_bool(plain: &str) -> Option<bool> {
    match plain {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// An integer: decimal, `0x`, `0o` or `0b`, with an optional sign. Digits with a leading zero (`007`) are a string,
/// as in YAML 1.2.
pub(super) fn parse_int(plain: &str) -> Option<i128> {
    let (negative, unsigned) = match plain.as_bytes().first() {
        Some(b'-') => (true, &plain[1..]),
        Some(b'+') => (false, &plain[1..]),
        _ => (false, plain),
    };
    if unsigned.starts_with(['+', '-']) {
        return None;
    }
    let (radix, digits) = if let Some(rest) = unsigned.strip_prefix("0x") {
        (16, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0b") {
        (2, rest)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    } else {
        (10, unsigned)
    };
    if digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

pub(super) fn parse_float(plain: &str) -> Option<f64> {
    let unsigned = plain.strip_prefix('+').unwrap_or(plain);
    if unsigned.starts_with(['+', '-']) && unsigned.len() != plain.len() {
        return None;
    }
    match unsigned {
        ".inf" | ".Inf" | ".INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    let digits = unsigned.strip_prefix('-').unwrap_or(unsigned);
    if digits.len() > 1 && digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    unsigned.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// What an event holds, for "invalid type" errors: a plain scalar as what it resolves to.
fn unexpected<'e>(event: &'e Event<'_>) -> Unexpected<'e> {
    match event {
        Event::Scalar(text, style, ..) => {
            if *style != ScalarStyle::Plain {
                return Unexpected::Str(text);
            }
            if is_null(text) {
                Unexpected::Unit
            } else if let Some(b) = parse_bool(text) {
                Unexpected::Bool(b)
            } else if let Some(i) = parse_int(text) {
                match u64::try_from(i) {
                    Ok(u) => Unexpected::Unsigned(u),
                    Err(_) => i64::try_from(i).map_or(Unexpected::Str(text), Unexpected::Signed),
                }
            } else if let Some(f) = parse_float(text) {
                Unexpected::Float(f)
            } else {
                Unexpected::Str(text)
            }
        }
        Event::SequenceStart(..) => Unexpected::Seq,
        Event::MappingStart(..) => Unexpected::Map,
        _ => Unexpected::Other("the end of a collection"),
    }
}

pub(super) fn invalid_type(event: &Event<'_>, expected: &dyn Expected) -> Error {
    de::Error::invalid_type(unexpected(event), expected)
}

pub(super) fn visit_text<'a, V: Visitor<'a>>(text: Cow<'a, str>, visitor: V) -> Result<V::Value, Error> {
    match text {
        Cow::Borrowed(s) => visitor.visit_borrowed_str(s),
        Cow::Owned(s) => visitor.visit_string(s),
    }
}
