//! The example configuration files in docs/ are accepted by the binaries they document (every key is a real
//! setting, every value has the right shape and passes the tier's own `serve --check-config`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::process::Command;

use zl_e2e::bin;

#[test]
fn example_configs_are_valid() {
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("docs");
    for (binary, file) in [
        ("zl-worker", "zl-worker.example.toml"),
        ("zl-orchestrator", "zl-orchestrator.example.toml"),
        ("zl-frontend", "zl-frontend.example.toml"),
    ] {
        let path = docs.join(file);
        // `--check-config` parses, expands the file into flags and runs every check that needs no file.
        let out = Command::new(bin(binary))
            .args(["serve", "--config", path.to_str().unwrap(), "--check-config"])
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("the configuration is valid"),
            "{binary} rejects {file}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // A value of the right shape that the checks refuse is caught too, with the reason.
        let out = Command::new(bin(binary))
            .args(["serve", "--config", path.to_str().unwrap(), "--check-config", "--discovery", "consul"])
            .args(["--consul-addr", "https://127.0.0.1:8501"])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("--consul-ca-file"), "{binary}: {said}");
        // And a bad key is caught, so the check above is not vacuous.
        let bad = std::env::temp_dir().join(format!("zl-bad-{}-{binary}.toml", std::process::id()));
        std::fs::write(&bad, "no-such-setting = 1\n").unwrap();
        let out =
            Command::new(bin(binary)).args(["serve", "--config", bad.to_str().unwrap(), "--help"]).output().unwrap();
        std::fs::remove_file(&bad).unwrap();
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unknown setting"));
    }
}
