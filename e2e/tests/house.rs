//! `scripts/check-house`, the house rules CI holds the workspace to: it passes on this workspace, and it fails,
//! naming the files, on a small crate made with a file-level import circle, a module-level one, and a file over
//! 800 lines (so the check itself cannot silently stop checking).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn check(root: &Path) -> Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-house");
    Command::new("python3").arg(script).arg(root).output().expect("python3 runs scripts/check-house")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A crate in `dir` with `files` (path under `src/`, content).
fn write_crate(dir: &Path, files: &[(&str, &str)]) {
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"house\"\nversion = \"0.0.0\"\n").unwrap();
    for (path, body) in files {
        let path = dir.join("src").join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }
}

#[test]
fn the_workspace_keeps_the_house_rules() {
    let out = check(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_circle_between_files_fails_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let lib = "mod a;\nmod b;\nmod c;\n";
    // a -> b -> c -> a, each through a different kind of path; the child naming its parent (super::) is no arrow.
    let a = "use crate::b::B;\npub(crate) struct A;\nfn f(_: B) { let _ = super::X; }\n";
    let b = "pub(crate) struct B(pub(crate) super::c::C);\n";
    let c = "pub(crate) struct C;\nfn g() -> Option<crate::a::A> { None }\n";
    write_crate(dir.path(), &[("lib.rs", lib), ("a.rs", a), ("b.rs", b), ("c.rs", c)]);
    let out = check(dir.path());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("import circle: src/a.rs, src/b.rs, src/c.rs"), "{said}");
    assert!(said.contains("src/c.rs -> src/a.rs: crate::a::A"), "{said}");

    // Without the arrow back, the same crate passes.
    std::fs::write(dir.path().join("src/c.rs"), "pub(crate) struct C;\n").unwrap();
    let out = check(dir.path());
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_circle_between_modules_fails() {
    let dir = tempfile::tempdir().unwrap();
    // No two files import each other, but the top-level modules `low` and `high` do (through different files).
    let lib = "pub mod high;\npub mod low;\n";
    let high = "mod part;\npub use part::H;\n";
    let part = "pub struct H(pub crate::low::leaf::L);\n";
    let low = "pub mod leaf;\npub fn up() -> Option<crate::high::part::H> { None }\n";
    let leaf = "pub struct L;\n";
    let files =
        [("lib.rs", lib), ("high/mod.rs", high), ("high/part.rs", part), ("low/mod.rs", low), ("low/leaf.rs", leaf)];
    write_crate(dir.path(), &files);
    let out = check(dir.path());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("module circle in .: high, low"), "{said}");
}

#[test]
fn a_file_over_800_lines_fails() {
    let dir = tempfile::tempdir().unwrap();
    let long = "// line\n".repeat(801);
    write_crate(dir.path(), &[("lib.rs", "mod big;\n"), ("big.rs", &long)]);
    let out = check(dir.path());
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("src/big.rs: 801 lines"), "{said}");
}
