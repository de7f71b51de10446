//! Generates the admin API's Rust code from `schemas/admin.proto`, with `$PROTOC` if set, else a vendored protoc
//! (no system package needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = tonic_prost_build::Config::new();
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    tonic_prost_build::configure().compile_with_config(config, &["../schemas/admin.proto"], &["../schemas"])?;
    println!("cargo:rerun-if-changed=../schemas/admin.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
