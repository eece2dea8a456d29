//! The key space a load draws descriptor values from: one hot key, `N` keys uniformly, or `N` keys by a Zipf law.
//!
//! Sampling uses a small random number generator written here ([`SplitMix64`]) rather than the `rand` crate: a load
//! generator needs speed and reproducibility, not cryptographic quality, and every request slot gets its own
//! generator so there is nothing to share or lock.

use std::fmt;
use std::sync::Arc;

/// The most keys a Zipf distribution may have: its cumulative table takes 8 bytes per key.
pub const MAX_ZIPF_KEYS: u64 = 10_000_000;

/// A key distribution as given with `--keys`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeySpec {
    /// Every descriptor carries the same value: one counter, the worst case for contention.
    Hot,
    /// Values `0..keys`, each equally likely.
    Uniform { keys: u64 },
    /// Values `0..keys`, value `k` with probability proportional to `1 / (k + 1)^exponent`: a few hot keys and a
    /// long tail, as real client populations look.
    Zipf { keys: u64, exponent: f64 },
}

impl KeySpec {
    /// Parses `hot`, `uniform:N` or `zipf:N[:S]` (S defaults to 1); the error names the offending part.
    pub fn parse(text: &str) -> Result<KeySpec, String> {
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            ["hot"] => Ok(KeySpec::Hot),
            ["uniform", keys] => Ok(KeySpec::Uniform {
                keys: key_count(keys, u64::MAX)?,
            }),
            ["zipf", keys] => Ok(KeySpec::Zipf {
                keys: key_count(keys, MAX_ZIPF_KEYS)?,
                exponent: 1.0,
            }),
            ["zipf", keys, exponent] => Ok(KeySpec::Zipf {
                keys: key_count(keys, MAX_ZIPF_KEYS)?,
                exponent: match exponent.parse::<f64>() {
                    Ok(s) if s.is_finite() && s > 0.0 && s <= 10.0 => s,
                    _ => {
                        return Err(format!(
                            "zipf exponent '{exponent}' is not a number above 0 and at most 10"
                        ));
                    }
                },
            }),
            _ => Err(format!(
                "'{text}' is not a key distribution (expected hot, uniform:N or zipf:N[:S])"
            )),
        }
    }
}

fn key_count(text: &str, max: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("key count '{text}' is not a whole number from 1 to {max}")),
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::Hot => f.write_str("hot"),
            KeySpec::Uniform { keys } => write!(f, "uniform:{keys}"),
            KeySpec::Zipf { keys, exponent } => write!(f, "zipf:{keys}:{exponent}"),
        }
    }
}

/// A [`KeySpec`] ready to sample: the Zipf table is computed once and shared by every request slot.
#[derive(Debug, Clone)]
pub enum Keys {
    Hot,
    Uniform(u64),
    /// The cumulative distribution: entry `k` is the probability of drawing a value `<= k`; the last is 1.
    Zipf(Arc<[f64]>),
}

impl Keys {
    pub fn new(spec: KeySpec) -> Keys {
        match spec {
            KeySpec::Hot => Keys::Hot,
            KeySpec::Uniform { keys } => Keys::Uniform(keys),
            KeySpec::Zipf { keys, exponent } => Keys::Zipf(zipf_cdf(keys, exponent)),
        }
    }

    /// Draws a key index.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        match self {
            Keys::Hot => 0,
            Keys::Uniform(keys) => rng.below(*keys),
            Keys::Zipf(cdf) => {
                let u = rng.next_f64();
                // The first index whose cumulative probability exceeds u; rounding can only push it past the end.
                let index = cdf.partition_point(|&c| c <= u);
                index.min(cdf.len() - 1) as u64
            }
        }
    }
}

fn zipf_cdf(keys: u64, exponent: f64) -> Arc<[f64]> {
    let mut cdf: Vec<f64> = Vec::with_capacity(keys as usize);
    let mut total = 0.0;
    for k in 0..keys {
        total += ((k + 1) as f64).powf(-exponent);
        cdf.push(total);
    }
    for c in &mut cdf {
        *c /= total;
    }
    if let Some(last) = cdf.last_mut() {
        *last = 1.0;
    }
    cdf.into()
}

/// SplitMix64 (Steele, Lea and Flood, 2014): one addition and two multiply-xorshift rounds per number, good
/// enough statistically for picking keys, and fast enough to vanish next to a gRPC call.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A generator for request slot `slot`. The seed is scrambled first so that neighbouring slots do not walk
    /// overlapping sequences.
    pub fn for_slot(slot: u64) -> SplitMix64 {
        SplitMix64::new(SplitMix64::new(slot ^ 0x5151_1ce0_b3c4_d5e6).next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (Lemire's multiply-shift; the bias is below 2^-64 * n, invisible here). `n` must be > 0.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs_and_names_bad_parts() {
        assert_eq!(KeySpec::parse("hot"), Ok(KeySpec::Hot));
        assert_eq!(KeySpec::parse("uniform:100000"), Ok(KeySpec::Uniform { keys: 100_000 }));
        assert_eq!(
            KeySpec::parse("zipf:10"),
            Ok(KeySpec::Zipf {
                keys: 10,
                exponent: 1.0
            })
        );
        assert_eq!(
            KeySpec::parse("zipf:10:1.2"),
            Ok(KeySpec::Zipf {
                keys: 10,
                exponent: 1.2
            })
        );
        let err = |s| KeySpec::parse(s).unwrap_err();
        assert!(err("uniform:0").contains("key count '0'"));
        assert!(err("uniform:x").contains("key count 'x'"));
        assert!(err("zipf:100000000").contains("from 1 to 10000000"));
        assert!(err("zipf:10:-1").contains("zipf exponent '-1'"));
        assert!(err("zipf:10:nan").contains("zipf exponent 'nan'"));
        assert!(err("pareto:10").contains("'pareto:10' is not a key distribution"));
        assert!(err("hot:1").contains("is not a key distribution"));
    }

    #[test]
    fn spec_display_parses_back() {
        for text in ["hot", "uniform:7", "zipf:9:1.5"] {
            let spec = KeySpec::parse(text).unwrap();
            assert_eq!(KeySpec::parse(&spec.to_string()), Ok(spec));
        }
    }

    #[test]
    fn uniform_covers_its_range_and_no_more() {
        let keys = Keys::new(KeySpec::Uniform { keys: 10 });
        let mut rng = SplitMix64::for_slot(0);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[keys.sample(&mut rng) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn zipf_follows_its_law() {
        let keys = Keys::new(KeySpec::Zipf {
            keys: 10,
            exponent: 1.0,
        });
        let mut rng = SplitMix64::for_slot(3);
        let mut seen = [0u32; 10];
        let draws = 100_000;
        for _ in 0..draws {
            seen[keys.sample(&mut rng) as usize] += 1;
        }
        // P(0) = 1 / H(10) = 0.3414, P(9) = P(0) / 10.
        let share = |k: usize| f64::from(seen[k]) / f64::from(draws);
        assert!((share(0) - 0.3414).abs() < 0.01, "{seen:?}");
        assert!((share(9) - 0.03414).abs() < 0.005, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0] > w[1]), "{seen:?}");
    }

    #[test]
    fn slots_draw_different_sequences() {
        let mut a = SplitMix64::for_slot(0);
        let mut b = SplitMix64::for_slot(1);
        let a: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        assert!(a.iter().all(|x| !b.contains(x)));
        let mut r = SplitMix64::new(42);
        assert!((0..1000).map(|_| r.next_f64()).all(|x| (0.0..1.0).contains(&x)));
    }
}
