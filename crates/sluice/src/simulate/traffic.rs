//! The traffic a simulation replays: a shape described in YAML (steady, bursts, a ramp, a diurnal curve; keys spread
//! evenly or by a Zipf law) or a recorded trace of timestamps and keys in CSV. Generated traffic is deterministic: the
//! same file and seed, the same requests.

use std::path::Path;

use serde::Deserialize;

/// One request: when (microseconds from the start) and which key (an index into [`Traffic::keys`]).
pub type Arrival = (u64, u32);

/// The requests to replay, in time order, and the descriptor they carry.
pub struct Traffic {
    pub domain: String,
    /// The descriptor key; each request's value is one of `keys`.
    pub key: String,
    pub keys: Vec<String>,
    pub arrivals: Vec<Arrival>,
    /// How long the traffic lasts, in seconds: every arrival is before its end.
    pub seconds: u64,
    /// The seconds the per-second figures cover, each whole: all of a shape's; a trace's up to the second its last
    /// request falls in, which is left out (the trace ends within it, so it would read as a drop to nothing), at least
    /// one.
    pub charted_seconds: u64,
}

/// A traffic file: a shape, or a trace.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Spec {
    domain: String,
    key: String,
    /// A CSV trace (`seconds,key` per line, relative to this file) instead of a shape.
    trace: Option<String>,
    #[serde(default)]
    shape: Option<String>,
    /// Seconds of traffic (a shape only).
    seconds: Option<u64>,
    /// Mean requests per second (outside bursts; at the start of a ramp).
    rate: Option<f64>,
    bursts: Option<Bursts>,
    ramp: Option<Ramp>,
    diurnal: Option<Diurnal>,
    #[serde(default)]
    keys: Keys,
    #[serde(default = "one")]
    seed: u64,
}

fn one() -> u64 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Bursts {
    /// A burst starts every `every` seconds...
    every: f64,
    /// ...lasts `length` seconds...
    length: f64,
    /// ...at `factor` times the rate.
    factor: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Ramp {
    /// The rate at the end.
    to: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Diurnal {
    /// Seconds per cycle.
    period: f64,
    /// How far the rate swings, as a fraction of it (0 to 1).
    amplitude: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys {
    count: u32,
    /// The Zipf exponent: 0 spreads requests evenly, 1 and above piles them on the first keys.
    zipf: f64,
    /// The values, `<prefix><n>`.
    prefix: String,
}

impl Default for Keys {
    fn default() -> Keys {
        Keys {
            count: 1,
            zipf: 0.0,
            prefix: "k".into(),
        }
    }
}

/// The most requests a traffic file may describe.
pub const MAX_REQUESTS: usize = 200_000_000;

/// Reads a traffic file; an error names the file, and the line and field at fault.
pub fn load(path: &Path) -> Result<Traffic, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("traffic '{}': cannot read: {e}", path.display()))?;
    let at = |field: &str, message: &str| {
        format!(
            "traffic '{}'{}: {field}: {message}",
            path.display(),
            line_of(&text, field)
        )
    };
    let spec: Spec = serde_yaml_ng::from_str(&text).map_err(|e| format!("traffic '{}': {e}", path.display()))?;
    if spec.domain.is_empty() {
        return Err(at("domain", "empty"));
    }
    if spec.key.is_empty() {
        return Err(at("key", "empty"));
    }
    if let Some(trace) = &spec.trace {
        if spec.shape.is_some() || spec.rate.is_some() {
            return Err(at(
                "trace",
                "a trace replays recorded requests: no shape or rate with it",
            ));
        }
        let file = path.parent().unwrap_or(Path::new(".")).join(trace);
        let (keys, arrivals) = read_trace(&file)?;
        let seconds = arrivals.last().map_or(0, |a| a.0 / 1_000_000 + 1);
        return Ok(Traffic {
            domain: spec.domain,
            key: spec.key,
            keys,
            arrivals,
            seconds,
            charted_seconds: seconds.saturating_sub(1).max(1),
        });
    }
    let seconds = spec
        .seconds
        .ok_or_else(|| at("seconds", "missing (how long the traffic lasts)"))?;
    if seconds == 0 || seconds > 86_400 {
        return Err(at("seconds", "from 1 to 86400"));
    }
    let rate = spec
        .rate
        .ok_or_else(|| at("rate", "missing (mean requests per second)"))?;
    if !(rate > 0.0 && rate <= 10_000_000.0) {
        return Err(at("rate", "a number above 0, at most 10000000"));
    }
    let keys = &spec.keys;
    if keys.count == 0 || keys.count > 10_000_000 {
        return Err(at("keys.count", "from 1 to 10000000"));
    }
    if !(0.0..=5.0).contains(&keys.zipf) {
        return Err(at("keys.zipf", "from 0 to 5"));
    }
    let shape = shape(&spec, at)?;
    let arrivals = generate(&shape, rate, seconds, keys, spec.seed).map_err(|m| at("rate", &m))?;
    Ok(Traffic {
        domain: spec.domain,
        key: spec.key,
        keys: (0..keys.count).map(|i| format!("{}{i}", keys.prefix)).collect(),
        arrivals,
        seconds,
        charted_seconds: seconds,
    })
}

/// The line a top-level field is on in `text`, as " line N", when the file has it.
fn line_of(text: &str, field: &str) -> String {
    let top = field.split('.').next().unwrap_or(field);
    text.lines()
        .position(|l| {
            l.strip_prefix(top)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| format!(" line {}", i + 1))
        .unwrap_or_default()
}

/// The shape a traffic file describes, its parameters checked; `at` words an error about a field.
fn shape(spec: &Spec, at: impl Fn(&str, &str) -> String) -> Result<Shape, String> {
    Ok(match spec.shape.as_deref().unwrap_or("steady") {
        "steady" => Shape::Steady,
        "bursts" => {
            let b = spec
                .bursts
                .as_ref()
                .ok_or_else(|| at("bursts", "missing: {every, length, factor}"))?;
            if !(b.every > 0.0 && b.length > 0.0 && b.length <= b.every && b.factor >= 0.0) {
                return Err(at("bursts", "every > 0, 0 < length <= every, factor >= 0"));
            }
            Shape::Bursts {
                every: b.every,
                length: b.length,
                factor: b.factor,
            }
        }
        "ramp" => {
            let r = spec.ramp.as_ref().ok_or_else(|| at("ramp", "missing: {to}"))?;
            if !(r.to >= 0.0 && r.to <= 10_000_000.0) {
                return Err(at("ramp.to", "a number from 0 to 10000000"));
            }
            Shape::Ramp { to: r.to }
        }
        "diurnal" => {
            let d = spec
                .diurnal
                .as_ref()
                .ok_or_else(|| at("diurnal", "missing: {period, amplitude}"))?;
            if !(d.period > 0.0 && (0.0..=1.0).contains(&d.amplitude)) {
                return Err(at("diurnal", "period > 0, amplitude from 0 to 1"));
            }
            Shape::Diurnal {
                period: d.period,
                amplitude: d.amplitude,
            }
        }
        other => {
            return Err(at(
                "shape",
                &format!("unknown shape '{other}' (expected steady, bursts, ramp or diurnal)"),
            ));
        }
    })
}

enum Shape {
    Steady,
    Bursts { every: f64, length: f64, factor: f64 },
    Ramp { to: f64 },
    Diurnal { period: f64, amplitude: f64 },
}

impl Shape {
    /// The rate at second `t` of `seconds`.
    fn rate(&self, base: f64, t: f64, seconds: f64) -> f64 {
        match *self {
            Shape::Steady => base,
            Shape::Bursts { every, length, factor } => {
                if t % every < length {
                    base * factor
                } else {
                    base
                }
            }
            Shape::Ramp { to } => base + (to - base) * t / seconds,
            Shape::Diurnal { period, amplitude } => {
                base * (1.0 + amplitude * (2.0 * std::f64::consts::PI * t / period).sin())
            }
        }
    }
}

/// A small, fast deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Poisson count of mean `mean` (Knuth's method below 30, a rounded normal above).
    fn poisson(&mut self, mean: f64) -> u64 {
        if mean <= 0.0 {
            return 0;
        }
        if mean > 30.0 {
            // Box-Muller.
            let (u, v) = (self.unit().max(f64::MIN_POSITIVE), self.unit());
            let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            return (mean + z * mean.sqrt()).round().max(0.0) as u64;
        }
        let limit = (-mean).exp();
        let (mut k, mut p) = (0, 1.0);
        loop {
            p *= self.unit();
            if p <= limit {
                return k;
            }
            k += 1;
        }
    }
}

/// Poisson arrivals at the shape's rate, a millisecond at a time, each spread evenly at random within its
/// millisecond, keys drawn by the Zipf law.
fn generate(shape: &Shape, base: f64, seconds: u64, keys: &Keys, seed: u64) -> Result<Vec<Arrival>, String> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // The Zipf law's cumulative weights, searched per request.
    let weights: Vec<f64> = (1..=keys.count)
        .scan(0.0, |sum, k| {
            *sum += 1.0 / f64::from(k).powf(keys.zipf);
            Some(*sum)
        })
        .collect();
    let total = weights.last().copied().unwrap_or(1.0);
    let mut arrivals = Vec::new();
    for ms in 0..seconds * 1_000 {
        let t = ms as f64 / 1_000.0;
        let n = rng.poisson(shape.rate(base, t, seconds as f64).max(0.0) / 1_000.0);
        if arrivals.len() as u64 + n > MAX_REQUESTS as u64 {
            return Err(format!(
                "more than {MAX_REQUESTS} requests: lower the rate or the seconds"
            ));
        }
        let mut offsets: Vec<u64> = (0..n).map(|_| rng.next() % 1_000).collect();
        offsets.sort_unstable();
        for offset in offsets {
            let key = if keys.count == 1 {
                0
            } else {
                let x = rng.unit() * total;
                weights.partition_point(|&w| w <= x).min(keys.count as usize - 1) as u32
            };
            arrivals.push((ms * 1_000 + offset, key));
        }
    }
    Ok(arrivals)
}

/// Reads a CSV trace: `seconds,key` per line (seconds from the start, a decimal number; a first line that is not a
/// number is a header), in time order.
fn read_trace(file: &Path) -> Result<(Vec<String>, Vec<Arrival>), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("trace '{}': cannot read: {e}", file.display()))?;
    let mut keys: Vec<String> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut arrivals = Vec::new();
    let mut last = 0;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |field: &str, m: String| format!("trace '{}' line {}: {field}: {m}", file.display(), n + 1);
        let (time, key) = line
            .split_once(',')
            .ok_or_else(|| at("line", "expected 'seconds,key'".into()))?;
        let seconds: f64 = match time.trim().parse() {
            Ok(s) => s,
            Err(_) if n == 0 => continue,
            Err(_) => return Err(at("seconds", format!("'{}' is not a number", time.trim()))),
        };
        if !(0.0..=86_400.0).contains(&seconds) {
            return Err(at("seconds", format!("{seconds} is not within 0 to 86400")));
        }
        let t = (seconds * 1e6).round() as u64;
        if t < last {
            return Err(at(
                "seconds",
                format!("{seconds} is before the line above (the trace must be in time order)"),
            ));
        }
        last = t;
        let key = key.trim();
        if key.is_empty() {
            return Err(at("key", "empty".into()));
        }
        let k = *index.entry(key.to_string()).or_insert_with(|| {
            keys.push(key.to_string());
            keys.len() as u32 - 1
        });
        arrivals.push((t, k));
        if arrivals.len() > MAX_REQUESTS {
            return Err(at("line", format!("more than {MAX_REQUESTS} requests")));
        }
    }
    if arrivals.is_empty() {
        return Err(format!("trace '{}': no requests", file.display()));
    }
    Ok((keys, arrivals))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn shapes_have_their_rate_and_are_deterministic() {
        let dir = tempfile::tempdir().unwrap();
        let steady = write(
            dir.path(),
            "s.yaml",
            "domain: d\nkey: k\nseconds: 100\nrate: 50\nkeys: {count: 10, zipf: 1.0, prefix: u}\n",
        );
        let t = load(&steady).unwrap();
        let n = t.arrivals.len() as f64;
        assert!((4_700.0..5_300.0).contains(&n), "{n}");
        assert_eq!(
            t.arrivals,
            load(&steady).unwrap().arrivals,
            "the same seed, the same requests"
        );
        assert!(t.arrivals.windows(2).all(|w| w[0].0 <= w[1].0));
        // Zipf 1 over 10 keys: the first key has about a third of the requests.
        let first = t.arrivals.iter().filter(|a| a.1 == 0).count() as f64 / n;
        assert!((0.30..0.38).contains(&first), "{first}");
        assert_eq!(t.keys[3], "u3");
        let bursts = write(
            dir.path(),
            "b.yaml",
            "domain: d\nkey: k\nseconds: 100\nrate: 10\nshape: bursts\nbursts: {every: 10, length: 1, factor: 11}\n",
        );
        let n = load(&bursts).unwrap().arrivals.len() as f64;
        assert!((1_850.0..2_150.0).contains(&n), "{n}");
    }

    #[test]
    fn mistakes_name_file_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("domain: d\nkey: k\nseconds: 10\n", "rate: missing"),
            (
                "domain: d\nkey: k\nseconds: 10\nrate: 5\nshape: square\n",
                "shape: unknown shape 'square'",
            ),
            (
                "domain: d\nkey: k\nseconds: 10\nrate: 5\nshape: bursts\n",
                "bursts: missing",
            ),
            ("domain: d\nkey: k\nseconds: 10\nrate: -1\n", "rate: a number above 0"),
            (
                "domain: d\nkey: k\nseconds: 10\nrate: 5\nspeed: 3\n",
                "unknown field `speed`",
            ),
            (
                "domain: d\nkey: k\nseconds: 10\nrate: 5\nkeys: {count: 0, zipf: 0, prefix: k}\n",
                "keys.count: from 1",
            ),
        ];
        for (text, want) in cases {
            let err = load(&write(dir.path(), "t.yaml", text)).err().unwrap();
            assert!(err.starts_with("traffic '") && err.contains(want), "{want}: {err}");
        }
        // A field the file has is named with its line.
        let err = load(&write(
            dir.path(),
            "t.yaml",
            "domain: d\nkey: k\nseconds: 10\nrate: -1\n",
        ))
        .err()
        .unwrap();
        assert!(err.contains("t.yaml' line 4: rate: a number above 0"), "{err}");
        write(dir.path(), "trace.csv", "seconds,key\n0.5,alice\n1.0,bob\nsoon,alice\n");
        let err = load(&write(dir.path(), "t.yaml", "domain: d\nkey: k\ntrace: trace.csv\n"))
            .err()
            .unwrap();
        assert!(
            err.contains("trace.csv' line 4: seconds: 'soon' is not a number"),
            "{err}"
        );
        write(dir.path(), "trace.csv", "2,alice\n1,bob\n");
        let err = load(&write(dir.path(), "t.yaml", "domain: d\nkey: k\ntrace: trace.csv\n"))
            .err()
            .unwrap();
        assert!(err.contains("line 2: seconds: 1 is before the line above"), "{err}");
        write(dir.path(), "trace.csv", "seconds,key\n0.5,alice\n1.25,bob\n1.5,alice\n");
        let t = load(&write(dir.path(), "t.yaml", "domain: d\nkey: k\ntrace: trace.csv\n")).unwrap();
        assert_eq!(
            (t.keys.clone(), t.arrivals.clone(), t.seconds),
            (
                vec!["alice".into(), "bob".into()],
                vec![(500_000, 0), (1_250_000, 1), (1_500_000, 0)],
                2
            )
        );
    }
}
