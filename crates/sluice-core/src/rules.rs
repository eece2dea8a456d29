//! The compiled, immutable rule set; the code lives in `rules/`, re-exported here so every path stays
//! `sluice_core::rules::X`.

mod compile;

pub use compile::*;
