//! The value syntaxes several groups of flags share.

/// A ratio between 0 and 1, inclusive.
pub(super) fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{s}' is not a ratio between 0 and 1")),
    }
}
