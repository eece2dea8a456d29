//! Key encoding: every key a store writes is built here, by [`CounterKey`], [`KeyBuilder`] and [`Identity`], in one
//! documented encoding, so that counters written by one version are found by the next.

use sha2::{Digest, Sha256};

use super::Span;
use crate::store::Algorithm;

/// How the keys of counters are written: the counters of a descriptor's limits ([`Identity::tier`]), and the windows
/// derived from them. Every other key (hit records, reservations, grant ledgers, lists, top offenders, queues' streams)
/// keeps the full form whatever the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyLayout {
    /// The full identity in every key, as earlier versions wrote them: `<prefix>{<tag>}<identity>|<algorithm>/<window
    /// seconds>`, readable, and as long as the request's text.
    Full,
    /// `<prefix>{<tag>}<digest><code><window seconds>`: the same hash tag (so a counter keeps its cluster slot), then
    /// 11 characters of digest of the identity, one letter for the algorithm and the window; about 40 bytes, whatever
    /// the request carries.
    #[default]
    Compact,
    /// Compact, with each counter's name in the full layout alongside ([`CounterKey::previous`]) until `until_us`:
    /// the Redis store moves the counters an earlier version wrote to their compact names before it decides, so a
    /// switch of layout loses no count.
    Moving { until_us: u64 },
    /// Compact, but a descriptor whose one limit is a fixed window of a second, a minute, an hour or a day keeps it
    /// under the key envoyproxy/ratelimit gives it, `<prefix><domain>_<key>_<value>_..._<window start in seconds>`
    /// ([`Identity::reference_window`]), so that counts carry over from the reference and back.
    Reference,
}

impl KeyLayout {
    /// The layout at `now_us`: [`KeyLayout::Moving`] past its end is compact.
    pub fn at(self, now_us: u64) -> KeyLayout {
        match self {
            KeyLayout::Moving { until_us } if now_us >= until_us => KeyLayout::Compact,
            other => other,
        }
    }
}

/// The name of one counter in a store.
///
/// Encoding, in the full layout ([`KeyLayout::Full`]): `<prefix>{<tag>}<identity>|<algorithm>/<window seconds>`,
/// `<prefix>{<tag>}<identity>|records` for
/// hit records, `<prefix>{<tag>}<identity>|grants` for the grant ledger of an RLQS bucket, and
/// `<prefix>{<tag>}<identity>|reservation/<id>` for the record of a reservation (`<id>` as the caller gives it, last
/// in the key, after a name no algorithm has). In Redis a fixed window keeps each window's count under its own key,
/// the counter's key then `:<start>`, the window's first microsecond in decimal ([`CounterKey::window`]). `<identity>` is `<domain>`
/// then, per descriptor entry, `|<key>=<value>`, every piece written as `<byte length>:<bytes>` (so `a_b`+`c` and
/// `a`+`b_c` can never collide, whatever bytes the request carries); an RLQS bucket's identity is `rlqs|` then the
/// same, with its entries in key order.
/// `<tag>` is 16 hex digits of a 64-bit FNV-1a hash of `<identity>`: a Redis hash tag that keeps every key of one
/// descriptor on one cluster slot, and that raw request text never reaches. The prefix may not contain `{` or `}`.
///
/// In the compact layout ([`KeyLayout::Compact`]) a limit's counter is `<prefix>{<tag>}<digest><code><window
/// seconds>`, and `/<label>` after it for a limit that counts a cost of its own (the label written as a piece):
/// `<digest>` is the first 64 bits of the SHA-256 of `<identity>` in 11 characters of URL-safe base64, and `<code>`
/// one letter per algorithm ([`code`]). Two identities share a key only if both their FNV-1a and their SHA-256
/// collide, which no request text can arrange. A queue's stream keeps its full name: workers read it.
#[derive(Debug, Clone)]
pub struct CounterKey {
    key: String,
    tag: u64,
    /// While the layout moves ([`KeyLayout::Moving`]): the name of the same counter in the full layout.
    previous: Option<String>,
    /// The reference's counter ([`KeyLayout::Reference`]): its windows are named by their start in seconds, right
    /// after the key.
    reference: bool,
}

/// A key is its name: the name it had in another layout is not part of it.
impl PartialEq for CounterKey {
    fn eq(&self, other: &CounterKey) -> bool {
        self.key == other.key
    }
}

impl Eq for CounterKey {}

impl std::hash::Hash for CounterKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl From<CounterKey> for String {
    fn from(key: CounterKey) -> String {
        key.key
    }
}

impl CounterKey {
    /// The key of the run-time entries of the list `name` in `domain`: `<prefix>{<tag>}list|<domain>|<name>=`, every
    /// piece with its length, an identity no descriptor or bucket can have (theirs start with a length or `rlqs|`).
    pub fn list(prefix: &str, domain: &str, name: &str) -> CounterKey {
        let identity = KeyBuilder::start(prefix, "list|", domain).entry(name, "").finish();
        CounterKey::named(identity.base, identity.tag)
    }

    /// The set of top values `kind` (`hits`, `denied`) of the rule `rule` in `domain`:
    /// `<prefix>{<tag>}top|<domain>|<rule>=<kind>`, every piece with its length.
    pub fn top(prefix: &str, domain: &str, rule: &str, kind: &str) -> CounterKey {
        let identity = KeyBuilder::start(prefix, "top|", domain).entry(rule, kind).finish();
        CounterKey::named(identity.base, identity.tag)
    }

    /// The per-second outcome counts of `domain` (see [`Series::series_add`](crate::store::Series::series_add)): `<prefix>{<tag>}series|<domain>`, and
    /// `:<second>` per second.
    pub fn series(prefix: &str, domain: &str) -> CounterKey {
        let identity = KeyBuilder::start(prefix, "series|", domain).finish();
        CounterKey::named(identity.base, identity.tag)
    }

    /// One second of a set of per-second counts.
    pub fn second(&self, second: u64) -> CounterKey {
        let mut key = String::with_capacity(self.key.len() + 12);
        key.push_str(&self.key);
        key.push(':');
        push_decimal(&mut key, second);
        CounterKey::named(key, self.tag)
    }

    /// One bucket of a set of top values: the set's key, `:s` (ten seconds) or `:m` (a minute), and the bucket's
    /// first microsecond.
    pub fn bucket(&self, span: Span, start_us: u64) -> CounterKey {
        let mut key = String::with_capacity(self.key.len() + 20);
        key.push_str(&self.key);
        key.push_str(if span == Span::Minute { ":s" } else { ":m" });
        push_decimal(&mut key, start_us);
        CounterKey::named(key, self.tag)
    }

    /// Starts the identity of a descriptor in `domain`, with the configured prefix.
    pub fn builder(prefix: &str, domain: &str) -> KeyBuilder {
        KeyBuilder::start(prefix, "", domain)
    }

    /// Starts the identity of an RLQS bucket in `domain`. Its counters never meet a descriptor's: the identity
    /// starts with `rlqs|`, where a descriptor's starts with a length.
    pub fn bucket_builder(prefix: &str, domain: &str) -> KeyBuilder {
        KeyBuilder::start(prefix, "rlqs|", domain)
    }

    /// A key of the full layout, or of one that names itself alone.
    pub(crate) fn named(key: String, tag: u64) -> CounterKey {
        CounterKey {
            key,
            tag,
            previous: None,
            reference: false,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// While the layout moves ([`KeyLayout::Moving`]): the same counter's key in the full layout, where an earlier
    /// version counted.
    pub fn previous(&self) -> Option<CounterKey> {
        self.previous.as_ref().map(|p| CounterKey::named(p.clone(), self.tag))
    }

    /// Whether this key has a name in the full layout to move from ([`CounterKey::previous`]).
    pub fn has_previous(&self) -> bool {
        self.previous.is_some()
    }

    /// The hash of the identity: equal for every key of one descriptor.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The key of one window of a fixed or sliding window's counter in Redis: this key, `:`, and the window's first
    /// microsecond (`algorithm/fixed_window.lua`'s `window_of`, `algorithm/sliding_window.lua`'s `sw_read`).
    pub fn window(&self, start_us: u64) -> CounterKey {
        if self.reference {
            let mut key = self.clone();
            push_decimal(&mut key.key, start_us / 1_000_000);
            return key;
        }
        let window = |name: &str| {
            let mut key = String::with_capacity(name.len() + 18);
            key.push_str(name);
            key.push(':');
            push_decimal(&mut key, start_us);
            key
        };
        CounterKey {
            key: window(&self.key),
            tag: self.tag,
            previous: self.previous.as_deref().map(window),
            reference: false,
        }
    }

    /// The key of what the other regions counted in one window of a global limit ([`CounterKey::window`] then
    /// `@regions`): a hash, one field per region, each that region's own count (`lua/global.lua`).
    pub fn regions(&self, start_us: u64) -> CounterKey {
        let mut key = self.window(start_us);
        key.key.push_str(REGIONS_SUFFIX);
        if let Some(previous) = &mut key.previous {
            previous.push_str(REGIONS_SUFFIX);
        }
        key
    }
}

/// What [`CounterKey::regions`] appends to a window's key (`lua/global.lua` knows it too).
const REGIONS_SUFFIX: &str = "@regions";

/// Appends entries to an identity.
#[derive(Debug)]
pub struct KeyBuilder {
    /// The whole key so far: the prefix, the tag's place, then the identity.
    out: String,
    /// Where the tag's 16 hex digits go, once the identity is complete.
    tag_at: usize,
    layout: KeyLayout,
    /// Where the domain's bytes are in `out`.
    domain: std::ops::Range<usize>,
    /// In the reference's layout, a descriptor's key in the reference's form so far.
    reference: Option<String>,
}

impl KeyBuilder {
    /// The key is built in one string, the tag's digits written in place at the end: a key costs one allocation
    /// and no formatting, on every hit.
    fn start(prefix: &str, kind: &str, domain: &str) -> KeyBuilder {
        let mut out = String::with_capacity(prefix.len() + 18 + kind.len() + domain.len() + 64);
        out.push_str(prefix);
        out.push('{');
        let tag_at = out.len();
        out.push_str("0000000000000000}");
        out.push_str(kind);
        piece(&mut out, domain);
        let domain = out.len() - domain.len()..out.len();
        KeyBuilder {
            out,
            tag_at,
            layout: KeyLayout::Full,
            domain,
            reference: None,
        }
    }

    /// Builds the counters' keys in `layout` (the full layout unless set). Set before any entry.
    pub fn layout(mut self, layout: KeyLayout) -> KeyBuilder {
        self.layout = layout;
        // Only a descriptor's identity (no kind before its domain) has a key in the reference's form.
        let descriptor = self.domain.start > self.tag_at + 17 && self.out.as_bytes()[self.tag_at + 17].is_ascii_digit();
        if layout == KeyLayout::Reference && descriptor {
            let mut key = String::with_capacity(self.tag_at + self.domain.len() + 48);
            key.push_str(&self.out[..self.tag_at - 1]);
            key.push_str(&self.out[self.domain.clone()]);
            key.push('_');
            self.reference = Some(key);
        }
        self
    }

    pub fn entry(mut self, key: &str, value: &str) -> KeyBuilder {
        if let Some(reference) = &mut self.reference {
            reference.push_str(key);
            reference.push('_');
            reference.push_str(value);
            reference.push('_');
        }
        self.out.push('|');
        piece(&mut self.out, key);
        self.out.push('=');
        piece(&mut self.out, value);
        self
    }

    /// Finishes the identity.
    pub fn finish(mut self) -> Identity {
        let digits = self.tag_at..self.tag_at + 16;
        let tag = fnv1a(&self.out.as_bytes()[digits.end + 1..]);
        let mut hex = [0u8; 16];
        for (i, d) in hex.iter_mut().enumerate() {
            *d = b"0123456789abcdef"[((tag >> (60 - 4 * i)) & 0xf) as usize];
        }
        self.out
            .replace_range(digits.clone(), std::str::from_utf8(&hex).unwrap_or_default());
        let compact = (self.layout != KeyLayout::Full).then(|| {
            let digest = Sha256::digest(&self.out.as_bytes()[digits.end + 1..]);
            let mut key = String::with_capacity(digits.end + 1 + 11 + 12);
            key.push_str(&self.out[..digits.end + 1]);
            push_base64(&mut key, &digest[..8]);
            key
        });
        Identity {
            base: self.out,
            tag,
            compact,
            moving: matches!(self.layout, KeyLayout::Moving { .. }),
            reference: self.reference,
        }
    }
}

/// The identity of one descriptor, from which its counters' keys are derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The identity in the full layout: `<prefix>{<tag>}<identity>`.
    base: String,
    tag: u64,
    /// In the compact layouts: `<prefix>{<tag>}<digest>`.
    compact: Option<String>,
    /// Whether each counter's key carries its full name too ([`KeyLayout::Moving`]).
    moving: bool,
    /// In the reference's layout: `<prefix><domain>_<key>_<value>_...` ([`KeyLayout::Reference`]).
    reference: Option<String>,
}

impl Identity {
    /// What every counter key of this identity starts with: `<prefix>{<tag>}<digest>` in the compact layout, the
    /// full identity otherwise.
    pub fn counters(&self) -> &str {
        self.compact.as_deref().unwrap_or(&self.base)
    }

    /// In the reference's layout ([`KeyLayout::Reference`]), the counter of a descriptor's one limit, a fixed window
    /// of `window_us`, under the key envoyproxy/ratelimit gives it: `<prefix><domain>_<key>_<value>_...`, each
    /// window's count then under that and its start in seconds ([`CounterKey::window`]). `None` in other layouts and
    /// for windows the reference has no unit for (a second, a minute, an hour and a day have one). The reference's
    /// keys carry no hash tag: a lone limit's one key needs none.
    pub fn reference_window(&self, window_us: u64) -> Option<CounterKey> {
        const UNITS: [u64; 4] = [1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000];
        let key = self.reference.as_ref().filter(|_| UNITS.contains(&window_us))?;
        Some(CounterKey {
            key: key.clone(),
            tag: self.tag,
            previous: None,
            reference: true,
        })
    }

    /// The key of one limit's state.
    pub fn tier(&self, algorithm: Algorithm, window_us: u64) -> CounterKey {
        self.counter(algorithm, window_us, None)
    }

    /// The key of a limit that counts a cost of its own (see `rules::TierCost`): `label` names it, so that two limits
    /// with the same algorithm and window (input and output tokens per minute) keep separate counters.
    pub fn tier_costing(&self, algorithm: Algorithm, window_us: u64, label: &str) -> CounterKey {
        self.counter(algorithm, window_us, Some(label))
    }

    /// A limit's counter, in this identity's layout.
    fn counter(&self, algorithm: Algorithm, window_us: u64, label: Option<&str>) -> CounterKey {
        let full = || {
            let name = algorithm.name();
            let mut key = String::with_capacity(self.base.len() + name.len() + 22);
            key.push_str(&self.base);
            key.push('|');
            key.push_str(name);
            key.push('/');
            push_decimal(&mut key, window_us / 1_000_000);
            if let Some(label) = label {
                key.push('/');
                piece(&mut key, label);
            }
            key
        };
        let compact = match &self.compact {
            Some(compact) if algorithm != Algorithm::Queue => compact,
            _ => return CounterKey::named(full(), self.tag),
        };
        let mut key = String::with_capacity(compact.len() + 12);
        key.push_str(compact);
        key.push(code(algorithm));
        push_decimal(&mut key, window_us / 1_000_000);
        if let Some(label) = label {
            key.push('/');
            piece(&mut key, label);
        }
        CounterKey {
            key,
            tag: self.tag,
            previous: self.moving.then(full),
            reference: false,
        }
    }

    /// The grant ledger of an RLQS bucket's quota ([`Grant`](super::Grant)): `<base>|grants`.
    pub fn grants(&self) -> CounterKey {
        CounterKey::named(format!("{}|grants", self.base), self.tag)
    }

    /// The key of the record of the reservation `id` ([`ReservationSpec`](super::ReservationSpec)): `<base>|reservation/<id>`, with the
    /// descriptor's hash tag.
    pub fn reservation(&self, id: &str) -> CounterKey {
        CounterKey::named(format!("{}|reservation/{id}", self.base), self.tag)
    }

    /// The key of the hit-record list.
    pub fn records(&self) -> CounterKey {
        CounterKey::named(format!("{}|records", self.base), self.tag)
    }
}

/// The letter of an algorithm in a compact key. Never changed once released: counters are found by it.
pub fn code(algorithm: Algorithm) -> char {
    match algorithm {
        Algorithm::FixedWindow => 'f',
        Algorithm::SlidingWindow => 's',
        Algorithm::SlidingLog => 'l',
        Algorithm::TokenBucket => 't',
        Algorithm::LeakyBucket => 'k',
        Algorithm::Concurrency => 'c',
        Algorithm::Queue => 'q',
        Algorithm::BucketedWindow => 'b',
    }
}

/// Appends `bytes` in URL-safe base64 without padding: no brace, colon or bar, so a compact key's digest can never
/// end its hash tag or look like a window's suffix.
fn push_base64(out: &mut String, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = 0u32;
    let mut held = 0;
    for &b in bytes {
        bits = (bits << 8) | u32::from(b);
        held += 8;
        while held >= 6 {
            held -= 6;
            out.push(char::from(ALPHABET[((bits >> held) & 63) as usize]));
        }
    }
    if held > 0 {
        out.push(char::from(ALPHABET[((bits << (6 - held)) & 63) as usize]));
    }
}

fn piece(out: &mut String, s: &str) {
    push_decimal(out, s.len() as u64);
    out.push(':');
    out.push_str(s);
}

/// Appends `n` in decimal, without going through `fmt` (keys are built on every hit).
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// 64-bit FNV-1a: stable across processes and versions, which a hash tag must be.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Checks a key prefix: it may not contain hash-tag braces.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.contains(['{', '}']) {
        return Err(format!("key prefix '{prefix}' may not contain '{{' or '}}'"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entries: &[(&str, &str)]) -> String {
        let mut b = CounterKey::builder("p:", "d");
        for (k, v) in entries {
            b = b.entry(k, v);
        }
        b.finish().tier(Algorithm::FixedWindow, 60_000_000).key
    }

    #[test]
    fn encoding_is_unambiguous() {
        assert_ne!(key(&[("a_b", "c")]), key(&[("a", "b_c")]));
        assert_ne!(key(&[("a", "b|c=d")]), key(&[("a", "b"), ("c", "d")]));
        assert_ne!(key(&[("a", "")]), key(&[("a", "}")]));
    }

    #[test]
    fn layout_and_hash_tag() {
        let k = key(&[("user", "{x}")]);
        assert!(k.starts_with("p:{"), "{k}");
        let tag_end = k.find('}').unwrap();
        assert_eq!(tag_end, 3 + 16, "{k}");
        assert!(k[3..tag_end].chars().all(|c| c.is_ascii_hexdigit()));
        assert!(k.ends_with("1:d|4:user=3:{x}|fixed_window/60"), "{k}");
        // Byte for byte: counters written by one version are found by the next.
        assert_eq!(k, "p:{424ad63badd19887}1:d|4:user=3:{x}|fixed_window/60");
    }

    fn compact(layout: KeyLayout, entries: &[(&str, &str)]) -> CounterKey {
        let mut b = CounterKey::builder("p:", "d").layout(layout);
        for (k, v) in entries {
            b = b.entry(k, v);
        }
        b.finish().tier(Algorithm::FixedWindow, 60_000_000)
    }

    #[test]
    fn compact_keys_keep_the_tag_and_are_short() {
        let full = key(&[("user", "{x}")]);
        let k = compact(KeyLayout::Compact, &[("user", "{x}")]);
        // Byte for byte: the tag of the full layout (the same cluster slot), the digest, the algorithm, the window.
        assert_eq!(k.as_str(), "p:{424ad63badd19887}TOG7--mLoiMf60");
        assert_eq!(k.as_str()[..19], full[..19]);
        assert_eq!(k.previous(), None);
        let long = "v".repeat(4_000);
        let k = compact(KeyLayout::Compact, &[("user", &long), ("path", "/a/b")]);
        assert_eq!(k.as_str().len(), "p:".len() + 18 + 11 + 3, "{}", k.as_str());
        let labelled = CounterKey::builder("p:", "d")
            .layout(KeyLayout::Compact)
            .finish()
            .tier_costing(Algorithm::TokenBucket, 60_000_000, "input");
        assert!(labelled.as_str().ends_with("t60/5:input"), "{}", labelled.as_str());
    }

    #[test]
    fn compact_keys_are_unambiguous() {
        let k = |entries: &[(&str, &str)]| compact(KeyLayout::Compact, entries).as_str().to_string();
        assert_ne!(k(&[("a_b", "c")]), k(&[("a", "b_c")]));
        assert_ne!(k(&[("a", "b|c=d")]), k(&[("a", "b"), ("c", "d")]));
        assert_ne!(k(&[("a", "")]), k(&[("a", "}")]));
        let id = CounterKey::builder("p:", "d").layout(KeyLayout::Compact).finish();
        let names: std::collections::HashSet<String> = Algorithm::ALL
            .iter()
            .flat_map(|&a| [1, 60, 3_600].map(|w| id.tier(a, w * 1_000_000).as_str().to_string()))
            .collect();
        assert_eq!(
            names.len(),
            Algorithm::ALL.len() * 3,
            "one key per algorithm and window"
        );
    }

    #[test]
    fn a_moving_layout_names_the_full_key_alongside() {
        let moving = KeyLayout::Moving { until_us: 10 };
        let k = compact(moving, &[("user", "{x}")]);
        assert_eq!(k.as_str(), "p:{424ad63badd19887}TOG7--mLoiMf60");
        assert_eq!(k.previous().unwrap().as_str(), key(&[("user", "{x}")]));
        assert_eq!(
            k.window(120).previous().unwrap().as_str(),
            format!("{}:120", key(&[("user", "{x}")]))
        );
        assert!(k.regions(120).previous().unwrap().as_str().ends_with("60:120@regions"));
        assert_eq!(moving.at(9), moving);
        assert_eq!(moving.at(10), KeyLayout::Compact);
        // A queue's stream keeps its full name: workers read it.
        let id = CounterKey::builder("p:", "d").layout(KeyLayout::Compact).finish();
        assert!(id.tier(Algorithm::Queue, 60_000_000).as_str().ends_with("|queue/60"));
    }

    #[test]
    fn the_reference_layout_names_a_lone_fixed_window_as_the_reference_does() {
        let id = CounterKey::builder("rl:", "edge")
            .layout(KeyLayout::Reference)
            .entry("user", "a_b")
            .entry("path", "/x")
            .finish();
        let minute = id.reference_window(60_000_000).unwrap();
        assert_eq!(minute.as_str(), "rl:edge_user_a_b_path_/x_");
        assert_eq!(
            minute.window(1_700_000_040_123_456).as_str(),
            "rl:edge_user_a_b_path_/x_1700000040"
        );
        assert!(id.reference_window(120_000_000).is_none(), "no unit of two minutes");
        // Every other limit is compact.
        assert!(id.tier(Algorithm::FixedWindow, 60_000_000).as_str().starts_with("rl:{"));
        let full = CounterKey::builder("rl:", "edge").layout(KeyLayout::Compact).finish();
        assert!(full.reference_window(60_000_000).is_none());
        let bucket = CounterKey::bucket_builder("rl:", "edge")
            .layout(KeyLayout::Reference)
            .finish();
        assert!(
            bucket.reference_window(60_000_000).is_none(),
            "RLQS buckets have no reference key"
        );
    }

    #[test]
    fn every_key_of_a_descriptor_shares_the_tag() {
        let id = CounterKey::builder("", "d").entry("k", "v").finish();
        let a = id.tier(Algorithm::FixedWindow, 1_000_000);
        let b = id.tier(Algorithm::TokenBucket, 1_000_000);
        let r = id.records();
        let v = id.reservation("req-1");
        assert!(v.key.ends_with("1:k=1:v|reservation/req-1"), "{}", v.key);
        assert_eq!(v.tag(), a.tag());
        assert_eq!(v.key[..18], a.key[..18]);
        assert_ne!(a, b);
        assert_eq!(a.key[..18], b.key[..18]);
        assert_eq!(a.key[..18], r.key[..18]);
        assert_eq!((a.tag(), b.tag()), (r.tag(), r.tag()));
        assert!(check_prefix("a{").is_err());
    }
}
