//! The container image runs, not only builds: `scripts/image` packs the OCI image with umoci (no container
//! engine), then the image is unpacked into a root file system of its own and its binaries run from it under
//! `chroot` as the image's non-root user, with nothing from the host.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `chroot` into `rootfs` as the image's user (65532), with an empty environment (chroot itself found on the
/// system's PATH).
fn chroot(rootfs: &Path) -> Command {
    let mut cmd = Command::new("chroot");
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").arg("--userspec=65532:65532").arg(rootfs);
    cmd
}

/// Run `args` inside the unpacked image as its user.
fn inside(rootfs: &Path, args: &[&str]) -> String {
    run(chroot(rootfs).args(args))
}

#[test]
fn the_image_runs_its_binaries_from_its_own_root_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("oci");
    let built = run(Command::new(root().join("scripts/image")).arg(&layout));
    let image = built.trim().lines().last().unwrap().to_owned();
    assert!(image.ends_with(concat!(":", env!("CARGO_PKG_VERSION"))), "{image}");

    let umoci = root().join(".tools/umoci/usr/bin/umoci");
    let bundle = dir.path().join("bundle");
    run(Command::new(&umoci).args(["unpack", "--image", &image]).arg(&bundle));
    let rootfs = bundle.join("rootfs");
    // What the image declares: a non-root user, zl as the entry point.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["process"]["user"]["uid"], 65532);
    assert_eq!(config["process"]["args"][0], "/usr/local/bin/zl");
    // Only what the binaries need: no shell, no package manager.
    assert!(!rootfs.join("bin/sh").exists() && !rootfs.join("usr/bin").exists());

    let version = inside(&rootfs, &["/usr/local/bin/zl", "version"]);
    assert!(version.starts_with(concat!("zl ", env!("CARGO_PKG_VERSION"))), "{version}");
    assert!(inside(&rootfs, &["/usr/local/bin/zl-worker", "--help"]).contains("serve"));
    for tier in ["zl-orchestrator", "zl-frontend", "zl-worker"] {
        let mut args = vec![format!("/usr/local/bin/{tier}"), "serve".into(), "--check-config".into()];
        args.extend(["--tls-dir".into(), "/home/zerolayer/tls".into()]);
        if tier == "zl-frontend" {
            args.extend(["--orchestrator".into(), "zl-orchestrator-0.zl-orchestrator:7000".into()]);
        }
        let said = inside(&rootfs, &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(said.contains("the configuration is valid"), "{tier}: {said}");
    }
    // The non-root user can write its home (caches, data), as a pod's would with a writable volume there.
    inside(&rootfs, &["/usr/local/bin/zl", "certs", "init", "--out", "/home/zerolayer/tls"]);
    assert!(rootfs.join("home/zerolayer/tls/ca.pem").is_file());
}
