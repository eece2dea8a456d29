//! Gathers the algorithms' scripts (`src/store/algorithm/*.lua`, one beside each algorithm's Rust file) into one
//! file the Redis store's decision script includes, so that adding an algorithm adds its script without a list to
//! keep. In name order, each in a block of its own (`do ... end`): no algorithm's script sees another's locals, only
//! what `lua/prelude.lua` exports.

use std::path::Path;

fn main() {
    let dir = Path::new("src/store/algorithm");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut scripts: Vec<_> = std::fs::read_dir(dir)
        .expect("src/store/algorithm is readable")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "lua"))
        .collect();
    scripts.sort();
    let mut all = String::new();
    for script in &scripts {
        println!("cargo:rerun-if-changed={}", script.display());
        all.push_str("do\n");
        all.push_str(&std::fs::read_to_string(script).expect("an algorithm's script is readable"));
        all.push_str("end\n");
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out).join("algorithms.lua"), all).expect("OUT_DIR is writable");
}
