//! Deny lists at scale: a list of a million CIDR ranges (IPv4 and IPv6) read from a file next to the configuration,
//! what it costs to load and to keep, and what a request descriptor costs to check against it: `cargo bench -p
//! sluice-tools --bench lists`. `cargo test --benches` (no `--bench` flag) runs a quick smoke pass with a few
//! thousand ranges.
//!
//! Prints the load time, the ranges kept after merging, the bytes they take (and the process's resident memory
//! before and after), then checks per lookup: an IPv4 address inside a range, one outside every range, an IPv6
//! address, and a value that is not an address.

use std::hint::black_box;
use std::time::Instant;

use sluice_core::config::load;
use sluice_core::metrics::Metrics;
use sluice_core::rules::RuleSet;

const ENTRIES: usize = 1_000_000;
const SMOKE_ENTRIES: usize = 5_000;

/// A small deterministic generator (xorshift), so every run measures the same list.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The process's resident memory, in bytes (Linux).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A deny list of `entries` ranges, one per line.
fn list_text(entries: usize) -> String {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut text = String::with_capacity(entries * 20);
    // Nine in ten IPv4 ranges of /24 to /32 (hosts and small networks, as blocklists hold), one in ten IPv6 ranges of
    // /32 to /64.
    for i in 0..entries {
        let r = rng.next();
        if i % 10 == 9 {
            let bits = 32 + (r % 33);
            text.push_str(&format!(
                "2001:{:x}:{:x}:{:x}::/{bits}\n",
                (r >> 8) & 0xffff,
                (r >> 24) & 0xffff,
                (r >> 40) & 0xffff
            ));
        } else {
            let bits = 24 + (r % 9);
            let a = (r >> 8) as u32;
            text.push_str(&format!(
                "{}.{}.{}.{}/{bits}\n",
                a >> 24,
                (a >> 16) & 255,
                (a >> 8) & 255,
                a & 255
            ));
        }
    }
    text
}

fn main() {
    let entries = if std::env::args().any(|a| a == "--bench") {
        ENTRIES
    } else {
        SMOKE_ENTRIES
    };
    let dir = tempfile::tempdir().expect("a scratch directory");
    let text = list_text(entries);
    std::fs::write(dir.path().join("blocked.txt"), &text).expect("the list file");
    std::fs::write(
        dir.path().join("edge.yaml"),
        "domain: edge\nlists:\n  - {name: blocked, key: remote_address, file: blocked.txt}\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
    )
    .expect("the configuration");
    let before = resident();
    let started = Instant::now();
    let rules = RuleSet::compile(&load(dir.path()).expect("loads"), &Metrics::discarded(0.8)).expect("compiles");
    let loaded = started.elapsed();
    let after = resident();
    let lists = &rules.domain("edge").expect("the domain").lists;
    let list = lists.iter().next().expect("the list");
    println!(
        "{entries} ranges ({} bytes of text): loaded in {:.2} s; {} ranges after merging, {} bytes of ranges; resident \
         memory {} MB before, {} MB after",
        text.len(),
        loaded.as_secs_f64(),
        list.len(),
        list.memory_bytes(),
        before >> 20,
        after >> 20
    );
    drop(text);
    let entry = |v: &str| vec![("remote_address".to_string(), v.to_string())];
    let inside = text_inside(&mut Rng(0x9e37_79b9_7f4a_7c15));
    // The first of a few addresses spread over the space that no range holds.
    let outside = (1u32..)
        .map(|i| std::net::Ipv4Addr::from(i.wrapping_mul(0x9e37_79b9)).to_string())
        .find(|a| lists.verdict(&entry(a), None).is_none())
        .expect("an address outside every range");
    let cases = [
        ("IPv4 inside a range", entry(&inside)),
        ("IPv4 outside every range", entry(&outside)),
        ("IPv6", entry("2001:db8:1234::1")),
        ("not an address", entry("client-42")),
    ];
    let rounds = if entries == ENTRIES { 2_000_000 } else { 20_000 };
    for (name, entries) in cases {
        let started = Instant::now();
        let mut hits = 0usize;
        for _ in 0..rounds {
            hits += usize::from(black_box(lists).verdict(black_box(&entries), None).is_some());
        }
        let per = started.elapsed().as_nanos() as f64 / rounds as f64;
        println!("{name}: {per:.0} ns per descriptor (matched {} of {rounds})", hits);
    }
}

/// An address inside the first range the generator made.
fn text_inside(rng: &mut Rng) -> String {
    let r = rng.next();
    let a = (r >> 8) as u32;
    let bits = 24 + (r % 9) as u32;
    let mask = if bits == 32 { u32::MAX } else { !(u32::MAX >> bits) };
    let inside = (a & mask) | (!mask & 0x0000_0001);
    std::net::Ipv4Addr::from(inside).to_string()
}
