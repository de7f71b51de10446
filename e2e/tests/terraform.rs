//! The Terraform modules and example, checked with no cloud access: `scripts/check-terraform` parses every file as
//! HCL, checks variables (typed, described, used), outputs (described), providers (declared with versions) and
//! every local module call (required inputs passed, nothing undeclared), runs checkov's static scan, and with the
//! `terraform` binary validates the provider-free modules and plans the example's fleet, rendering each region's
//! chart values with `helm template`. And it can fail: broken copies are refused, naming each fault.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn check(dir: &Path) -> Output {
    Command::new(zl_e2e::python()).arg(root().join("scripts/check-terraform")).arg(dir).output().unwrap()
}

#[test]
fn the_terraform_passes_the_offline_checks() {
    let out = check(&root().join("terraform"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "scripts/check-terraform failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("5 module calls consistent") && stdout.contains("checkov"), "{stdout}");
    assert!(stdout.contains("plan (3 regions' values through helm template) ok"), "{stdout}");
}

/// The defects the plan found, put back: pools typed `any` inside the fleet's map (regions whose pools differ
/// have no common type), a GPU pool without a CUDA device, and no TLS where peers use https.
#[test]
fn a_fleet_that_cannot_plan_or_whose_values_are_wrong_fails_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("terraform");
    assert!(Command::new("cp").arg("-r").arg(root().join("terraform")).arg(&copy).status().unwrap().success());
    let edit = |file: &str, from: &str, to: &str| {
        let path = copy.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} has no {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    };
    let fleet = "modules/zerolayer-fleet/variables.tf";
    let typed = std::fs::read_to_string(copy.join(fleet)).unwrap();
    let start = typed.find("worker_pools = optional(list(object({").unwrap();
    let end = start + typed[start..].find("})), [])").unwrap() + "})), [])".len();
    edit(fleet, &typed[start..end], "worker_pools = optional(any, [])");
    let out = check(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot find a common"), "{stderr}");

    std::fs::write(copy.join(fleet), &typed).unwrap();
    edit("examples/three-regions/fleet.tf", "    device      = \"cuda:0\"\n", "");
    edit("modules/zerolayer-values/main.tf", "tlsSecret   = try(var.frontend_tls.secret, \"\")", "tlsSecret   = \"\"");
    let out = check(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in ["GPU pool gpu runs on 'cpu'", "peers reach it over https, but its Ingress has no TLS"] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
}

#[test]
fn broken_terraform_fails_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("terraform");
    assert!(Command::new("cp").arg("-r").arg(root().join("terraform")).arg(&copy).status().unwrap().success());
    // A module call without a required input, one with an input the module lacks, an unused variable, and a file
    // that is not HCL.
    let example = copy.join("examples/three-regions/main.tf");
    let text = std::fs::read_to_string(&example).unwrap();
    let text = text.replacen("  region          = module.fleet.regions[\"eu-west\"].region\n", "", 1);
    let anchor = "  hop_key         = var.hop_key\n";
    assert!(text.contains(anchor), "the example passes hop_key");
    let text = text.replacen(anchor, &format!("{anchor}  colour = \"blue\"\n"), 1);
    std::fs::write(&example, text).unwrap();
    let vars = copy.join("modules/zerolayer-fleet/variables.tf");
    let mut text = std::fs::read_to_string(&vars).unwrap();
    text.push_str(
        "\nvariable \"unused\" {\n  description = \"nothing\"\n  type        = string\n  default     = \"\"\n}\n",
    );
    std::fs::write(&vars, text).unwrap();
    std::fs::write(copy.join("modules/zerolayer-region/broken.tf"), "resource \"x\" {\n").unwrap();
    let out = check(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for want in [
        "module eu_west: does not pass the required input region",
        "module eu_west: passes colour, which ../../modules/zerolayer-region does not declare",
        "variable unused is declared but never used",
        "broken.tf: does not parse as HCL",
    ] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
}
