//! Key encoding: every key a store writes is built here, by [`CounterKey`], [`KeyBuilder`] and [`Identity`], in one
//! documented encoding, so that counters written by one version are found by the next.

use sha2::{Digest, Sha256};

use super::Span;
use crate::store::Algorithm;

/// How the keys of counters are written: the counters of a descriptor's limits ([`Identity::tier`]), and the windows
/// derived from them. Every other key (hit records, reservations, grant ledgers, lists, top offenders, queues' streams)
/// keeps its full name (below) whatever the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyLayout {
    /// `<prefix>{<slot>}<digest>`: three characters that hash to the slot of the descriptor's hash tag (so a counter
    /// lands beside its descriptor's other keys), then 10 characters of digest of the counter's identity and name; a
    /// fixed or sliding window's count then `:<window number in hex>`. 28 bytes for an hour's window with the default
    /// prefix, whatever the request carries.
    #[default]
    Compact,
    /// Compact, but a descriptor whose one limit is a fixed window of a second, a minute, an hour or a day keeps it
    /// under the key envoyproxy/ratelimit gives it, `<prefix><domain>_<key>_<value>_..._<window start in seconds>`
    /// ([`Identity::reference_window`]), so that counts carry over from the reference and back.
    Reference,
}

/// The name of one counter in a store.
///
/// Full names: `<prefix>{<tag>}<identity>|records` for hit records, `<prefix>{<tag>}<identity>|grants` for the grant
/// ledger of an RLQS bucket, `<prefix>{<tag>}<identity>|reservation/<id>` for the record of a reservation (`<id>` as
/// the caller gives it, last in the key, after a name no algorithm has), and `<prefix>{<tag>}<identity>|queue/<window
/// seconds>` for a queue's stream, which workers read. `<identity>` is `<domain>`
/// then, per descriptor entry, `|<key>=<value>`, every piece written as `<byte length>:<bytes>` (so `a_b`+`c` and
/// `a`+`b_c` can never collide, whatever bytes the request carries); an RLQS bucket's identity is `rlqs|` then the
/// same, with its entries in key order.
/// `<tag>` is 16 hex digits of a 64-bit FNV-1a hash of `<identity>`: a Redis hash tag that keeps every key of one
/// descriptor on one cluster slot, and that raw request text never reaches. The prefix may not contain `{` or `}`.
///
/// A limit's counter ([`KeyLayout::Compact`]) is `<prefix>{<slot>}<digest>`: `<slot>` is the
/// first of the three-character strings of URL-safe base64 (in alphabet order) whose Redis hash slot is that of
/// `<tag>` ([`slot_tag`]), so a counter lands on the slot of its descriptor's other keys; `<digest>` is the first 60
/// bits of the second 64 bits of the SHA-256 of `<identity>` XOR the 64-bit FNV-1a hash of the limit's name
/// (`|<algorithm>/<window seconds>`, and `/<label>` for a limit that counts a cost of its own, the label written as a
/// piece), in 10 characters of URL-safe base64. A fixed or sliding window's count is that key, `:`, and the window's
/// number (its first microsecond divided by the window's length) in lowercase hex, `lua/prelude.lua`'s `window_key`.
/// Counters of two identities share a key only if their slots and 60 bits of their identities' SHA-256 (shifted by
/// the known difference of their names' hashes) collide, which no request can aim at.
#[derive(Debug, Clone)]
pub struct CounterKey {
    key: String,
    tag: u64,
    /// How the keys of its windows are named ([`CounterKey::window`]).
    windows: Windows,
    /// A plain counter ([`CounterKey::plain`]): Redis keeps a fixed window's count as an integer per window under
    /// [`CounterKey::window`], rather than in its descriptor's packed state.
    plain: bool,
    /// What a limit's counter is known by in its descriptor's packed state ([`CounterKey::record`]); 0 for other keys.
    record: u64,
    /// The first 64 bits of the SHA-256 of its descriptor's identity, which name the packed state
    /// ([`CounterKey::packed`]); 0 for keys that are not a limit's counter.
    state: u64,
}

/// How a counter's windows are named after its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Windows {
    /// `:<first microsecond>` in decimal: keys with full names.
    Start,
    /// `:<first microsecond / window>` in lowercase hex: a compact fixed or sliding window of this many microseconds.
    Number(u64),
    /// The start in seconds, right after the key: the reference's counter ([`KeyLayout::Reference`]).
    Reference,
}

/// A key is its name.
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

    /// A key with a full name, or one that names itself alone.
    pub(crate) fn named(key: String, tag: u64) -> CounterKey {
        CounterKey {
            key,
            tag,
            windows: Windows::Start,
            plain: false,
            record: 0,
            state: 0,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The hash of the identity: equal for every key of one descriptor.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The key of one window of a fixed or sliding window's counter in Redis (`algorithm/fixed_window.lua`'s
    /// `window_of`, `lua/prelude.lua`'s `window_key`): this key, `:`, and the window's number in hex (see
    /// [`CounterKey`]); in the reference's layout, the start in seconds.
    pub fn window(&self, start_us: u64) -> CounterKey {
        let mut key = String::with_capacity(self.key.len() + 18);
        key.push_str(&self.key);
        match self.windows {
            Windows::Reference => push_decimal(&mut key, start_us / 1_000_000),
            Windows::Number(window_us) => {
                key.push(':');
                push_hex(&mut key, start_us / window_us);
            }
            Windows::Start => {
                key.push(':');
                push_decimal(&mut key, start_us);
            }
        }
        CounterKey {
            key,
            tag: self.tag,
            windows: Windows::Start,
            plain: false,
            record: 0,
            state: 0,
        }
    }

    /// This counter as a plain counter: a descriptor's one limit, a fixed window counted in one region, which Redis
    /// keeps as an integer per window under [`CounterKey::window`] (one INCRBY a hit, `fixed_window.lua`'s
    /// `L.counter`) rather than in the descriptor's packed state. The name is the same; the memory store keeps either
    /// alike.
    pub fn plain(mut self) -> CounterKey {
        self.plain = true;
        self
    }

    /// Whether Redis keeps this counter as a plain counter ([`CounterKey::plain`]; the reference's keys always are).
    pub fn is_plain(&self) -> bool {
        self.plain
    }

    /// The key of the packed state its descriptor's counting limits are kept in, in Redis (`lua/decide.lua`): this
    /// compact key's prefix and hash tag, `#`, then the first 60 bits of the SHA-256 of the descriptor's identity in
    /// 10 characters of URL-safe base64, `<prefix>{<slot>}#<digest>` (23 bytes with the default prefix): one key for
    /// every counter with this identity, that no counter's own key can be (their digests have no `#`), and that no
    /// request can aim at another descriptor's (the identity's FNV-1a tag, which a request could steer, only places
    /// it).
    pub fn packed(&self) -> CounterKey {
        let head = self.key.find('}').map_or(self.key.len(), |at| at + 1);
        let mut key = String::with_capacity(head + 17);
        key.push_str(&self.key[..head]);
        key.push(PACKED);
        push_base64(&mut key, &self.state.to_be_bytes(), DIGEST_CHARS);
        CounterKey::named(key, self.tag)
    }

    /// Whether this is a compact counter's own key (`<prefix>{<slot>}<digest>`), whose state Redis may keep in its
    /// descriptor's packed state.
    pub fn is_counter(&self) -> bool {
        self.key
            .find('{')
            .zip(self.key.find('}'))
            .is_some_and(|(open, close)| close == open + 4 && self.key.len() == close + 1 + DIGEST_CHARS)
    }

    /// What the counter's record is known by in its descriptor's packed state ([`CounterKey::packed`]): the 64-bit
    /// FNV-1a hash of the limit's name (`|<algorithm>/<window seconds>`, and `/<label>` for a limit that counts a cost
    /// of its own) shifted right by 16 bits, exact in the script's doubles. The same for a limit of every descriptor
    /// of one rule, so that their calls share their arguments; 0 for keys that are not a limit's counter.
    pub fn record(&self) -> u64 {
        self.record
    }

    /// The key of what the other regions counted in one window of a global limit ([`CounterKey::window`] then
    /// `@regions`): a hash, one field per region, each that region's own count (`lua/prelude.lua`'s `regions_count`).
    pub fn regions(&self, start_us: u64) -> CounterKey {
        let mut key = self.window(start_us);
        key.key.push_str(REGIONS_SUFFIX);
        key
    }
}

/// What follows the hash tag in the key of a packed state ([`CounterKey::packed`]).
const PACKED: char = '#';

/// What [`CounterKey::regions`] appends to a window's key (`lua/prelude.lua`'s `regions_count` knows it too).
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
            layout: KeyLayout::Compact,
            domain,
            reference: None,
        }
    }

    /// Builds the counters' keys in `layout` (compact unless set). Set before any entry.
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
        let mut compact = String::with_capacity(self.tag_at + 4);
        compact.push_str(&self.out[..self.tag_at]);
        let slot = fred::util::redis_keyslot(&hex);
        compact.push_str(std::str::from_utf8(&slot_tag(slot)).unwrap_or_default());
        compact.push('}');
        let sha = Sha256::digest(&self.out.as_bytes()[digits.end + 1..]);
        let word = |at: usize| u64::from_be_bytes(std::array::from_fn(|i| sha[at + i]));
        Identity {
            digest: [word(0), word(8)],
            base: self.out,
            tail_at: digits.end + 1,
            tag,
            compact,
            reference: self.reference,
        }
    }
}

/// The identity of one descriptor, from which its counters' keys are derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The identity's full name: `<prefix>{<tag>}<identity>`.
    base: String,
    /// Where `<identity>` starts in `base`, after the hash tag.
    tail_at: usize,
    /// The first 128 bits of the SHA-256 of `<identity>`, as two big-endian words: the first names the packed state
    /// ([`CounterKey::packed`]), the second, with each limit's name mixed in, its counters ([`Identity::tier`]).
    digest: [u64; 2],
    tag: u64,
    /// `<prefix>{<slot>}`, what every compact counter's key starts with.
    compact: String,
    /// In the reference's layout: `<prefix><domain>_<key>_<value>_...` ([`KeyLayout::Reference`]).
    reference: Option<String>,
}

impl Identity {
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
            windows: Windows::Reference,
            plain: true,
            record: 0,
            state: 0,
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

    /// A limit's counter: compact, but for a queue's stream, which keeps its full name (workers read it).
    fn counter(&self, algorithm: Algorithm, window_us: u64, label: Option<&str>) -> CounterKey {
        if algorithm.queues() {
            let mut key = String::with_capacity(self.base.len() + algorithm.name().len() + 24);
            key.push_str(&self.base);
            counter_name(&mut key, algorithm, window_us, label);
            return CounterKey::named(key, self.tag);
        }
        let head = &self.compact;
        let mut name = Fnv(FNV_OFFSET);
        counter_name(&mut name, algorithm, window_us, label);
        let mut key = String::with_capacity(head.len() + 10 + 10);
        key.push_str(head);
        push_base64(&mut key, &(self.digest[1] ^ name.0).to_be_bytes(), DIGEST_CHARS);
        let windows = if algorithm.keys_per_window() && window_us > 0 {
            Windows::Number(window_us)
        } else {
            Windows::Start
        };
        CounterKey {
            key,
            tag: self.tag,
            windows,
            plain: false,
            record: name.0 >> 16,
            state: self.digest[0],
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

/// How many characters of URL-safe base64 a compact key's digest has: 60 bits.
const DIGEST_CHARS: usize = 10;

/// URL-safe base64's alphabet: no brace, colon or bar, so a compact key's digest or slot can never end its hash tag
/// or look like a window's suffix.
const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Appends the first `chars` characters of `bytes` in URL-safe base64 (six bits each; `bytes` holds enough).
fn push_base64(out: &mut String, bytes: &[u8], chars: usize) {
    let mut bits = 0u32;
    let mut held = 0;
    let mut written = 0;
    for &b in bytes {
        bits = (bits << 8) | u32::from(b);
        held += 8;
        while held >= 6 && written < chars {
            held -= 6;
            out.push(char::from(BASE64[((bits >> held) & 63) as usize]));
            written += 1;
        }
    }
}

/// Redis Cluster's hash slots.
const SLOTS: u16 = 16_384;

/// The compact layout's hash tag for the cluster slot `slot`: the first three characters of URL-safe base64, in
/// alphabet order (`AAA`, `AAB`, ...), whose slot it is. Every slot has one (a unit test checks), found once per
/// process in a table of 16 384.
pub fn slot_tag(slot: u16) -> [u8; 3] {
    static TAGS: std::sync::OnceLock<Vec<[u8; 3]>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![[0u8; 3]; usize::from(SLOTS)];
        let mut found = vec![false; usize::from(SLOTS)];
        for &a in BASE64 {
            for &b in BASE64 {
                for &c in BASE64 {
                    let s = usize::from(fred::util::redis_keyslot(&[a, b, c]));
                    if !found[s] {
                        found[s] = true;
                        tags[s] = [a, b, c];
                    }
                }
            }
        }
        tags
    });
    tags[usize::from(slot % SLOTS)]
}

/// Where a key's text goes: the key being written, or a digest being taken of it (without writing it).
trait Sink {
    fn put(&mut self, s: &str);
}

impl Sink for String {
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
}

/// The 64-bit FNV-1a hash of what is put into it.
struct Fnv(u64);

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

impl Fnv {
    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

impl Sink for Fnv {
    fn put(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
}

/// What follows a counter's identity in its name, `|<algorithm>/<window seconds>` and `/<label>` for a limit that
/// counts a cost of its own: what a compact key's digest is taken over, and a queue's stream's full name.
fn counter_name(out: &mut impl Sink, algorithm: Algorithm, window_us: u64, label: Option<&str>) {
    out.put("|");
    out.put(algorithm.name());
    out.put("/");
    push_decimal(out, window_us / 1_000_000);
    if let Some(label) = label {
        out.put("/");
        piece(out, label);
    }
}

fn piece(out: &mut impl Sink, s: &str) {
    push_decimal(out, s.len() as u64);
    out.put(":");
    out.put(s);
}

/// Appends `n` in lowercase hex.
fn push_hex(out: &mut String, n: u64) {
    let digits = if n == 0 {
        1
    } else {
        (64 - n.leading_zeros()).div_ceil(4)
    };
    for i in (0..digits).rev() {
        out.push(char::from(b"0123456789abcdef"[((n >> (4 * i)) & 0xf) as usize]));
    }
}

/// Appends `n` in decimal, without going through `fmt` (keys are built on every hit).
fn push_decimal(out: &mut impl Sink, mut n: u64) {
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
    out.put(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// 64-bit FNV-1a: stable across processes and versions, which a hash tag must be.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = Fnv(FNV_OFFSET);
    h.bytes(bytes);
    h.0
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

    /// The full name of a descriptor's hit records (the counters' keys are compact: their digest is taken over
    /// the same identity).
    fn key(entries: &[(&str, &str)]) -> String {
        let mut b = CounterKey::builder("p:", "d");
        for (k, v) in entries {
            b = b.entry(k, v);
        }
        b.finish().records().key
    }

    #[test]
    fn encoding_is_unambiguous() {
        assert_ne!(key(&[("a_b", "c")]), key(&[("a", "b_c")]));
        assert_ne!(key(&[("a", "b|c=d")]), key(&[("a", "b"), ("c", "d")]));
        assert_ne!(key(&[("a", "")]), key(&[("a", "}")]));
    }

    #[test]
    fn full_names_and_hash_tag() {
        let k = key(&[("user", "{x}")]);
        assert!(k.starts_with("p:{"), "{k}");
        let tag_end = k.find('}').unwrap();
        assert_eq!(tag_end, 3 + 16, "{k}");
        assert!(k[3..tag_end].chars().all(|c| c.is_ascii_hexdigit()));
        // Byte for byte: keys written by one version are found by the next.
        assert_eq!(k, "p:{424ad63badd19887}1:d|4:user=3:{x}|records");
    }

    fn compact(layout: KeyLayout, entries: &[(&str, &str)]) -> CounterKey {
        let mut b = CounterKey::builder("p:", "d").layout(layout);
        for (k, v) in entries {
            b = b.entry(k, v);
        }
        b.finish().tier(Algorithm::FixedWindow, 60_000_000)
    }

    /// The Redis Cluster slot of a key, as Redis computes it (its hash tag's), and as the routing of calls does.
    fn slot(key: &str) -> u16 {
        fred::util::redis_keyslot(key.as_bytes())
    }

    #[test]
    fn every_slot_has_a_tag_of_three_characters() {
        for s in 0..SLOTS {
            let tag = slot_tag(s);
            assert!(tag.iter().all(|c| BASE64.contains(c)), "{tag:?}");
            assert_eq!(slot(&format!("{{{}}}", std::str::from_utf8(&tag).unwrap())), s);
        }
        assert_eq!(&slot_tag(slot("AAA")), b"AAA");
    }

    #[test]
    fn compact_keys_keep_the_slot_and_are_short() {
        let full = key(&[("user", "{x}")]);
        let k = compact(KeyLayout::Compact, &[("user", "{x}")]);
        // Byte for byte: the slot of the descriptor's hash tag in three characters, then the digest of the counter's
        // identity and name.
        assert_eq!(k.as_str(), "p:{Eoq}B0w1QXFNEW");
        assert_eq!(slot(k.as_str()), slot(&full));
        // A window's count is the window's number in hex.
        assert_eq!(
            k.window(60_000_000 * 0x1c0a3b7 + 5).as_str(),
            "p:{Eoq}B0w1QXFNEW:1c0a3b7"
        );
        assert_eq!(k.window(0).as_str(), "p:{Eoq}B0w1QXFNEW:0");
        let long = "v".repeat(4_000);
        let k = compact(KeyLayout::Compact, &[("user", &long), ("path", "/a/b")]);
        assert_eq!(k.as_str().len(), "p:".len() + 5 + 10, "{}", k.as_str());
        // An hour's window under the default prefix: 28 bytes, the most Redis keeps in its smallest allocation.
        let id = CounterKey::builder("sluice:", "d")
            .layout(KeyLayout::Compact)
            .entry("user", &long)
            .finish();
        let hour = id
            .tier(Algorithm::FixedWindow, 3_600_000_000)
            .window(1_764_032_400_000_000);
        assert_eq!(hour.as_str().len(), 28, "{}", hour.as_str());
        // The example of the storage guide.
        let alice = CounterKey::builder("sluice:", "edge")
            .layout(KeyLayout::Compact)
            .entry("user", "alice")
            .finish();
        let hour = alice.tier(Algorithm::FixedWindow, 3_600_000_000);
        assert_eq!(
            hour.window(1_764_032_400_000_000).as_str(),
            "sluice:{At7}Ro1oisb9Vt:77a19"
        );
        // Beside another limit, the same hour is a record of the descriptor's packed state.
        assert_eq!(hour.packed().as_str(), "sluice:{At7}#ACBe1QJeH9");
        assert_eq!(hour.record(), 29_008_981_599_465);
        assert!(hour.is_counter() && !hour.packed().is_counter() && !alice.records().is_counter());
        // Two identities whose FNV-1a tags agree (a request may steer its own) keep their packed states apart: the
        // state is named by the identity's SHA-256.
        let mallory = CounterKey::builder("sluice:", "edge")
            .layout(KeyLayout::Compact)
            .entry("user", "mallory")
            .finish();
        let forged = Identity {
            tag: alice.tag,
            compact: alice.compact.clone(),
            ..mallory
        };
        let theirs = forged.tier(Algorithm::FixedWindow, 3_600_000_000);
        assert_eq!(theirs.tag(), hour.tag());
        assert_ne!(theirs.packed(), hour.packed());
        // A label is part of the digest.
        let id = CounterKey::builder("p:", "d").layout(KeyLayout::Compact).finish();
        let input = id.tier_costing(Algorithm::TokenBucket, 60_000_000, "input");
        let output = id.tier_costing(Algorithm::TokenBucket, 60_000_000, "output");
        assert_ne!(input, output);
        assert_eq!(input.as_str().len(), 2 + 5 + 10);
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
    fn a_queue_keeps_its_full_name() {
        // Workers read a queue's stream by its name.
        let id = CounterKey::builder("p:", "d").finish();
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
        assert_eq!(
            id.tier(Algorithm::FixedWindow, 60_000_000).as_str().len(),
            "rl:".len() + 5 + 10
        );
        let compact = CounterKey::builder("rl:", "edge").layout(KeyLayout::Compact).finish();
        assert!(compact.reference_window(60_000_000).is_none());
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
        assert_ne!(a, b);
        // One cluster slot for all of them: the compact keys' tag is the full names' slot.
        let slots: std::collections::HashSet<u16> = [&a, &b, &r, &v, &a.window(0)]
            .iter()
            .map(|k| slot(k.as_str()))
            .collect();
        assert_eq!(slots.len(), 1);
        assert_eq!((a.tag(), b.tag()), (r.tag(), r.tag()));
        assert!(check_prefix("a{").is_err());
    }
}
