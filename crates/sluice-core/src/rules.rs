//! The compiled, immutable rule set; the code lives in `rules/`, re-exported here so every path stays
//! `sluice_core::rules::X`.

mod compile;
mod tree;
mod vocabulary;

pub use compile::*;
pub use tree::*;
pub use vocabulary::*;
