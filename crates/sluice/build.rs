//! Compiles the protobuf definitions in `proto/` with protox (pure Rust, no system `protoc`), then generates
//! the tonic services and prost messages. The file descriptor set is kept for gRPC reflection.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "../../proto/envoy/service/ratelimit/v3/rls.proto",
    "../../proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
    "../../proto/sluice/v1/sluice.proto",
    "../../proto/envoy/service/discovery/v3/ads.proto",
    "../../proto/ratelimit/config/ratelimit/v3/rls_conf.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(PROTOS, ["../../proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().compile_fds(fds)?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
