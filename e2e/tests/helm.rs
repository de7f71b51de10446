//! The Helm chart, checked offline (there is no Kubernetes API server here): `scripts/check-chart` lints it, renders
//! it over every values file in `helm/zerolayer/ci/`, validates the manifests against the Kubernetes versions the
//! chart supports, checks the wiring schemas cannot see, runs each rendered config through the real binary's
//! `serve --check-config`, and checks that bad values are refused with the schema's message.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_chart_lints_renders_validates_and_wires_up_in_every_variant() {
    let helm = root().join(".tools/helm/helm");
    assert!(helm.is_file(), "{} is missing: run scripts/install-helm (scripts/test does)", helm.display());
    let bin_dir = zl_e2e::bin("zl-orchestrator").parent().unwrap().to_owned();
    let out = Command::new(zl_e2e::python()).arg(root().join("scripts/check-chart")).arg(&bin_dir).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "scripts/check-chart failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("wiring and configs ok"), "{stdout}");
}

#[test]
fn the_charts_app_version_is_the_workspace_version() {
    let chart = std::fs::read_to_string(root().join("helm/zerolayer/Chart.yaml")).unwrap();
    let app = chart.lines().find_map(|l| l.strip_prefix("appVersion: ")).unwrap().trim_matches('"');
    assert_eq!(app, env!("CARGO_PKG_VERSION"));
}
