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

/// The checks can fail: a copy of the chart with one broken reference is refused, naming it.
/// `scripts/check-chart` over a copy of the chart in which `file` had `from` replaced by `to`: whether it passed,
/// and what it said on stderr.
fn check_edited_chart(file: &str, from: &str, to: &str) -> (bool, String) {
    check_edits(&[(file, from, to)])
}

/// [`check_edited_chart`] with several edits at once.
fn check_edits(edits: &[(&str, &str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("zerolayer");
    let copied = Command::new("cp").arg("-r").arg(root().join("helm/zerolayer")).arg(&chart).status().unwrap();
    assert!(copied.success());
    for (file, from, to) in edits {
        let path = chart.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} has no {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    }
    let bin_dir = zl_e2e::bin("zl-orchestrator").parent().unwrap().to_owned();
    let out = Command::new(zl_e2e::python())
        .arg(root().join("scripts/check-chart"))
        .arg(&bin_dir)
        .env("ZL_CHART", &chart)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_chart_with_a_broken_reference_fails_the_checks() {
    let (passed, stderr) = check_edited_chart("templates/frontend.yaml", "targetPort: http", "targetPort: htp");
    assert!(!passed, "a broken chart passed");
    assert!(stderr.contains("port htp is not a port of"), "{stderr}");
}

/// Day-2 wiring is checked: a chart whose new orchestrator ordinals would not join the group, or whose workers
/// and frontends would keep an old orchestrator list after a scale, is refused.
#[test]
fn a_chart_whose_orchestrators_do_not_follow_the_replica_count_fails_the_checks() {
    let (passed, stderr) = check_edited_chart("templates/orchestrator.yaml", "raft-auto-join = true", "");
    assert!(!passed, "a chart without raft-auto-join passed");
    assert!(stderr.contains("lacks raft-auto-join = true"), "{stderr}");
    let (passed, stderr) = check_edited_chart(
        "templates/_helpers.tpl",
        "list $shared .tier $v.orchestrator.replicas",
        "list $shared .tier",
    );
    assert!(!passed, "a chart whose pods keep an old orchestrator list passed");
    assert!(stderr.contains("do not roll when the orchestrator count changes"), "{stderr}");
}

/// The items of a YAML flow sequence of plain and double-quoted scalars (`[a, "b c", d]`).
fn flow_list(text: &str) -> Vec<String> {
    let inner = text.trim().trim_start_matches('[').trim_end_matches(']');
    let (mut items, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for c in inner.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => items.push(std::mem::take(&mut cur).trim().to_owned()),
            _ => cur.push(c),
        }
    }
    items.push(cur.trim().to_owned());
    items
}

/// The chart's `helm test` pod's command, replayed against a cluster on 127.0.0.1 (the Service's address mapped to
/// the frontend's, the key in its environment as the pod gets it): it succeeds, and fails when the request does.
#[test]
fn the_charts_helm_test_sends_one_request_through_the_frontend() {
    let out = Command::new(root().join(".tools/helm/helm"))
        .args(["template", "zl", "helm/zerolayer", "--show-only", "templates/tests/request.yaml"])
        .current_dir(root())
        .output()
        .unwrap();
    let pod = String::from_utf8(out.stdout).unwrap();
    assert!(pod.contains("helm.sh/hook: test"), "{pod}");
    let line = pod.lines().find(|l| l.trim_start().starts_with("command:")).expect("a command");
    let command = flow_list(line.trim_start().trim_start_matches("command:").trim());
    assert!(command.len() > 3, "{line}");
    let dir = tempfile::tempdir().unwrap();
    let key = "sk-zl-e2e-helm-test-0123456789abcdef";
    let cluster = zl_e2e::small_cluster(dir.path(), &["w-0"], &[], &[], key);
    let url = format!("http://{}", cluster.http);
    let args: Vec<String> = command[1..]
        .iter()
        .map(|a| if a.starts_with("http://zl-zerolayer-frontend") { url.clone() } else { a.clone() })
        .collect();
    let run = |key: &str| Command::new(zl_e2e::bin("zl")).args(&args).env("ZL_API_KEY", key).output().unwrap();
    let ok = run(key);
    assert!(ok.status.success(), "{args:?}: {}", String::from_utf8_lossy(&ok.stderr));
    assert!(!String::from_utf8_lossy(&ok.stdout).trim().is_empty(), "an answer was printed");
    let refused = run("sk-zl-not-a-key-0123456789");
    assert!(!refused.status.success(), "a failed request fails the test pod");
}

/// Each day-2 defect of the earlier chart, put back into a copy: each is named by its check.
#[test]
fn a_chart_with_the_day_2_defects_put_back_fails_each_check() {
    let (passed, stderr) = check_edits(&[
        ("templates/orchestrator.yaml", "    whenScaled: Delete\n", "    whenScaled: Retain\n"),
        ("templates/members-job.yaml", "helm.sh/hook: pre-upgrade", "helm.sh/hook: post-upgrade"),
        ("templates/bootstrap-job.yaml", "post-install,post-upgrade", "post-install"),
        (
            "templates/networkpolicy.yaml",
            " | default (dict \"matchLabels\" (dict \"kubernetes.io/metadata.name\" .Release.Namespace))",
            "",
        ),
        ("templates/monitoring.yaml", "  podTargetLabels: [app.kubernetes.io/instance, zerolayer.dev/pool]\n", ""),
        (
            "templates/orchestrator.yaml",
            "    - {name: admin, port: 7001, protocol: TCP}\n---",
            "    - {name: admin, port: 7001, protocol: TCP}\n    - {name: metrics, port: 9000, protocol: TCP}\n---",
        ),
        ("values.yaml", "pdb: {enabled: true, maxUnavailable: 1}", "pdb: {enabled: false, maxUnavailable: 1}"),
        (
            "ci/gpu-values.yaml",
            "rollout: {maxSurge: 0, maxUnavailable: 1}",
            "rollout: {maxSurge: 1, maxUnavailable: 0}",
        ),
        (
            "templates/frontend.yaml",
            "{{ ternary .Values.frontend.autoscaling.maxReplicas .Values.frontend.replicas .Values.frontend.autoscaling.enabled }}",
            "{{ .Values.frontend.replicas }}",
        ),
        ("templates/_helpers.tpl", ".Release.Name $name | trunc 39", ".Release.Name $name | trunc 40"),
        ("templates/tests/request.yaml", "    helm.sh/hook: test\n", ""),
        ("values.yaml", "renewSchedule: \"17 3 * * 0\"", "renewSchedule: \"\""),
        ("templates/key-pepper.yaml", "{{- if not .Values.keyPepper.existingSecret }}", "{{- if true }}"),
    ]);
    assert!(!passed, "a chart with the day-2 defects passed");
    for want in [
        "keeps a scaled-away member's volume",
        "no pre-upgrade Job runs `zl admin members trim 3`",
        "not on install and upgrade",
        "admits every namespace",
        "does not select exactly its pool's pods",
        "pods are scraped 2 times",
        "has no PodDisruptionBudget",
        "a full GPU pool cannot roll",
        "limits loosen as it scales",
        "Kubernetes takes at most 52 there",
        "no `helm test` pod",
        "no CronJob renews them",
        "two renders with apiKey.existingSecret differ",
    ] {
        assert!(stderr.contains(want), "{want:?} not in:\n{stderr}");
    }
}

/// The audit chain is on the pod's own claim by default: a chart whose frontends keep it on an emptyDir (which an
/// eviction takes with the pod) is refused.
#[test]
fn a_chart_that_keeps_the_audit_chain_on_an_empty_dir_fails_the_checks() {
    let on = "    persistence:\n      enabled: true";
    let (passed, stderr) = check_edited_chart("values.yaml", on, "    persistence:\n      enabled: false");
    assert!(!passed, "a chart keeping the audit chain on an emptyDir passed");
    assert!(stderr.contains("audit-dir /var/lib/zerolayer/audit: on an emptyDir"), "{stderr}");
}

#[test]
fn the_charts_app_version_is_the_workspace_version() {
    let chart = std::fs::read_to_string(root().join("helm/zerolayer/Chart.yaml")).unwrap();
    let app = chart.lines().find_map(|l| l.strip_prefix("appVersion: ")).unwrap().trim_matches('"');
    assert_eq!(app, env!("CARGO_PKG_VERSION"));
}

#[test]
fn zl_certs_kube_writes_the_secrets_the_charts_pods_read() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let out = dir.path().join("secrets.json");
    let kube = |out: &std::path::Path| {
        let args = ["certs", "kube", "--release", "zl", "--namespace", "inference", "--orchestrators", "3"];
        let result =
            zl_e2e::zl(&[&args[..], &["--ca-dir", ca_dir.to_str().unwrap(), "--out", out.to_str().unwrap()]].concat());
        assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    };
    kube(&out);
    let ca = std::fs::read_to_string(ca_dir.join("ca.pem")).unwrap();
    let list: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let secrets = list["items"].as_array().unwrap();
    let names: Vec<&str> = secrets.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    // The names the chart's pods mount (release `zl`: resources are prefixed `zl-zerolayer`).
    assert_eq!(names, ["zl-zerolayer-tls-orchestrator", "zl-zerolayer-tls-worker", "zl-zerolayer-tls-frontend"]);
    // Each Secret, mounted as the chart mounts it: the orchestrator pods' own identities; for workers and
    // frontends only the role's bootstrap credential, which is no pod's identity (each pod enrolls for its own).
    for (secret, role, pods) in [
        (
            &secrets[0],
            zl_wire::message::Role::Orchestrator,
            vec!["zl-zerolayer-orchestrator-0", "zl-zerolayer-orchestrator-2"],
        ),
        (&secrets[1], zl_wire::message::Role::Worker, vec!["zl-zerolayer-worker-cpu-7d9f8c6b5-x2x9z"]),
        (&secrets[2], zl_wire::message::Role::Frontend, vec!["zl-zerolayer-frontend-5c7d9-8kq2p"]),
    ] {
        assert_eq!(secret["metadata"]["namespace"], "inference");
        let mounted = dir.path().join(secret["metadata"]["name"].as_str().unwrap());
        std::fs::create_dir_all(&mounted).unwrap();
        for (file, text) in secret["stringData"].as_object().unwrap() {
            assert!(!file.starts_with("ca.key"), "the CA key never leaves --ca-dir");
            std::fs::write(mounted.join(file), text.as_str().unwrap()).unwrap();
        }
        assert_eq!(std::fs::read_to_string(mounted.join("ca.pem")).unwrap(), ca);
        for pod in pods {
            if role == zl_wire::message::Role::Orchestrator {
                zl_node::load_identity(&mounted, role, pod).unwrap_or_else(|e| panic!("{pod}: {e:#}"));
                continue;
            }
            assert!(zl_node::load_identity(&mounted, role, pod).is_err(), "no certificate shared by {role} pods");
            let boot = zl_tls::enroll::bootstrap_id(role);
            zl_node::load_identity(&mounted, zl_wire::message::Role::Bootstrap, boot.as_str())
                .unwrap_or_else(|e| panic!("the {role} bootstrap credential: {e:#}"));
        }
    }
    // Run again (a fourth orchestrator, or renewals): the same CA signs, so running pods keep trusting.
    kube(&dir.path().join("again.json"));
    assert_eq!(std::fs::read_to_string(ca_dir.join("ca.pem")).unwrap(), ca);
    assert!(ca_dir.join("admin-admin.pem").is_file(), "an admin certificate for zl admin");
    // As the chart's certificate Job runs it: the CA from a read-only mounted Secret, written back as a Secret
    // with an admin certificate for in-cluster zl admin.
    let work = dir.path().join("work");
    let args = ["certs", "kube", "--release", "zl", "--namespace", "inference", "--ca-secret", "--admin-secret"];
    let paths =
        ["--ca-from", ca_dir.to_str().unwrap(), "--ca-dir", work.to_str().unwrap(), "--admin-id", "zl-bootstrap"];
    let result = zl_e2e::zl(&[&args[..], &paths[..]].concat());
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let list: serde_json::Value = serde_json::from_slice(&result.stdout).unwrap();
    let by_name =
        |name: &str| list["items"].as_array().unwrap().iter().find(|s| s["metadata"]["name"] == name).cloned();
    let ca_secret = by_name("zl-zerolayer-ca").expect("the CA Secret");
    assert_eq!(ca_secret["stringData"]["ca.pem"], ca.as_str(), "the mounted CA, not a new one");
    assert!(ca_secret["stringData"]["ca.key"].as_str().unwrap().contains("PRIVATE KEY"));
    let admin = by_name("zl-zerolayer-tls-admin").expect("the admin Secret");
    assert!(admin["stringData"]["admin-zl-bootstrap.pem"].as_str().unwrap().contains("CERTIFICATE"));
    // The upgrade Job or the renewal CronJob run without the CA Secret (it is mounted optional): it fails rather
    // than mint a new CA over the running cluster, whose nodes would refuse everything it signs.
    let (empty, w2) = (dir.path().join("no-ca"), dir.path().join("w2"));
    let paths = ["--ca-from", empty.to_str().unwrap(), "--ca-dir", w2.to_str().unwrap()];
    let result = zl_e2e::zl(&[&args[..], &paths[..], &["--require-ca"]].concat());
    assert!(!result.status.success(), "a new CA was minted over a running cluster");
    assert!(String::from_utf8_lossy(&result.stderr).contains("--require-ca"));
    assert!(!w2.join("ca.pem").exists());
}
