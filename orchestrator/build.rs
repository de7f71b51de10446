//! Generates the Raft peer service's Rust code from `schemas/raft.proto`, with `$PROTOC` if set, else a vendored
//! protoc (no system package needed). Only orchestrators speak it, so only this crate compiles it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    tonic_prost_build::configure().compile_with_config(config, &["../schemas/raft.proto"], &["../schemas"])?;
    println!("cargo:rerun-if-changed=../schemas/raft.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
