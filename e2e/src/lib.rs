//! Helpers for zerolayer's black-box tests: find the real binaries (built beforehand by `scripts/test`) and run
//! them as processes. The tests build nothing themselves and talk to the processes only over 127.0.0.1.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Path of a workspace binary: `$ZL_BIN_DIR/NAME`, else `target/debug/NAME` of this workspace.
///
/// Panics with instructions when the binary has not been built, since a test that silently skips proves nothing.
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("ZL_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("debug"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first (`cargo build --workspace --bins`, which scripts/test runs)",
        path.display()
    );
    path
}

/// Run `zl` with `args` and capture its output.
pub fn zl(args: &[&str]) -> Output {
    Command::new(bin("zl")).args(args).output().expect("zl could not be started")
}
