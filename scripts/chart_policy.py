"""Who may get which certificate, with cert-manager (scripts/check-chart runs it): the rendered
CertificateRequestPolicies and their RBAC, evaluated over certificate requests the way cert-manager's
approver-policy decides them (policy.cert-manager.io/v1alpha1):

- a policy is appropriate for a request when its selector matches the request's issuer (name, kind defaulting to
  Issuer, group to cert-manager.io; `*` wildcards) and namespace, and the requester may `use` it (RBAC in the
  request's namespace);
- a request is approved when an appropriate policy allows all it asks (common name and DNS names against `value(s)`
  with wildcards and the CEL `validations`, `required`, no IP/URI/email names unless allowed, `isCA`, usages a
  subset, duration within `constraints.maxDuration`), denied when policies are appropriate but none allows it, and
  left unsigned when none is appropriate.

The requests: every pod's CSI volume as its ServiceAccount asks it (the CSI driver's token requests) and every
Certificate as cert-manager's controller asks it must be approved; what an attacker who can create pods in the
namespace would ask (another tier's names, the cluster CA's issuer, a wildcard, a CA, a name of two labels, any
other ServiceAccount) must not be. Not run here: approver-policy and cert-manager themselves (no API server).
"""
import os
import re
import shutil
import subprocess
import tempfile

CR_API = "policy.cert-manager.io/v1alpha1/CertificateRequestPolicy"
NAMESPACE = "inference"


def _wild(pattern, value):
    """approver-policy's wildcard: `*` matches any string (dots included); nothing else is special."""
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("*")), value) is not None


def _cel(rule, value):
    """The CEL the chart writes: self.matches('re'), self == 'x', self in ['x', ...], joined by || and &&."""
    expr = re.sub(r"self\.matches\(", "_matches(self, ", rule).replace("||", " or ").replace("&&", " and ")
    if re.search(r"[^\w\s'\[\],.()=|&^$?*+\\{}-]", expr.replace("_matches", "")):
        raise ValueError(f"CEL this check cannot evaluate: {rule}")
    return bool(eval(expr, {"__builtins__": {}}, {"self": value, "true": True, "false": False, "_matches": lambda s, r: re.search(r, s) is not None}))


def _string(value, allowed, errors, field):
    if not value:
        if allowed and allowed.get("required"):
            errors.append(f"{field} required")
        return
    if not allowed or ("value" not in allowed and not allowed.get("validations")):
        errors.append(f"{field} {value!r} not allowed")
        return
    if "value" in allowed and not _wild(allowed["value"], value):
        errors.append(f"{field} {value!r} is not {allowed['value']!r}")
    for v in allowed.get("validations") or []:
        if not _cel(v["rule"], value):
            errors.append(f"{field} {value!r} fails {v['rule']}")


def _slice(values, allowed, errors, field):
    if not values:
        if allowed and allowed.get("required"):
            errors.append(f"{field} required")
        return
    if not allowed or ("values" not in allowed and not allowed.get("validations")):
        errors.append(f"{field} {values} not allowed")
        return
    for value in values:
        if "values" in allowed and not any(_wild(p, value) for p in allowed["values"]):
            errors.append(f"{field} {value!r} not among {allowed['values']}")
        for v in allowed.get("validations") or []:
            if not _cel(v["rule"], value):
                errors.append(f"{field} {value!r} fails {v['rule']}")


def _hours(duration):
    total, units = 0.0, {"h": 3600, "m": 60, "s": 1}
    for n, u in re.findall(r"(\d+(?:\.\d+)?)([hms])", duration or ""):
        total += float(n) * units[u]
    return total


def permits(policy, cr):
    """The reasons `policy` does not allow `cr` (empty: it allows it)."""
    allowed, errors = policy["spec"].get("allowed") or {}, []
    _string(cr.get("commonName", ""), allowed.get("commonName"), errors, "commonName")
    for field in ("dnsNames", "ipAddresses", "uris", "emailAddresses"):
        _slice(cr.get(field) or [], allowed.get(field), errors, field)
    if cr.get("isCA") and not allowed.get("isCA"):
        errors.append("isCA not allowed")
    usages = cr.get("usages") or []
    if usages and not all(any(_wild(p, u) for p in allowed.get("usages") or []) for u in usages):
        errors.append(f"usages {usages} not within {allowed.get('usages')}")
    max_duration = (policy["spec"].get("constraints") or {}).get("maxDuration")
    if max_duration and cr.get("duration") and _hours(cr["duration"]) > _hours(max_duration):
        errors.append(f"duration {cr['duration']} over {max_duration}")
    return errors


def _selects(policy, cr):
    sel = policy["spec"]["selector"]
    ref = sel.get("issuerRef")
    if ref is not None:
        issuer = cr["issuer"]
        have = {"name": issuer["name"], "kind": issuer.get("kind") or "Issuer", "group": issuer.get("group") or "cert-manager.io"}
        if any(k in ref and not _wild(ref[k], have[k]) for k in have):
            return False
    names = (sel.get("namespace") or {}).get("matchNames") or []
    return not names or any(_wild(n, cr["namespace"]) for n in names)


def _may_use(docs, user, policy_name, namespace):
    """RBAC: does ServiceAccount `user` (namespace, name) hold `use` on the policy in `namespace`?"""
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    for b in docs:
        if b["kind"] != "RoleBinding" or b["roleRef"]["kind"] != "Role":
            continue
        if not any(s.get("kind") == "ServiceAccount" and (s.get("namespace") or namespace, s["name"]) == user for s in b.get("subjects") or []):
            continue
        for rule in (roles.get(b["roleRef"]["name"]) or {}).get("rules") or []:
            if ("policy.cert-manager.io" in rule.get("apiGroups", []) and "certificaterequestpolicies" in rule.get("resources", [])
                    and "use" in rule.get("verbs", []) and policy_name in rule.get("resourceNames", [policy_name])):
                return True
    return False


def decide(docs, cr):
    """approved / denied / pending, and why."""
    policies = [d for d in docs if d["kind"] == "CertificateRequestPolicy"]
    appropriate = [p for p in policies if _selects(p, cr) and _may_use(docs, cr["user"], p["metadata"]["name"], cr["namespace"])]
    if not appropriate:
        return "pending", "no policy is appropriate"
    reasons = {}
    for p in appropriate:
        errors = permits(p, cr)
        if not errors:
            return "approved", p["metadata"]["name"]
        reasons[p["metadata"]["name"]] = errors
    return "denied", reasons


def _csi_requests(docs):
    """What each pod's CSI volume asks, as the pod's ServiceAccount, with a pod name filled in."""
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            csi = v.get("csi") or {}
            if csi.get("driver") != "csi.cert-manager.io":
                continue
            a = csi["volumeAttributes"]
            pod = d["metadata"]["name"] + ("-0" if d["kind"] == "StatefulSet" else "-7d9f8c6b5-x2k4q")
            fill = lambda s: s.replace("${POD_NAME}", pod)
            yield d, {
                "user": (NAMESPACE, spec.get("serviceAccountName") or "default"),
                "namespace": NAMESPACE,
                "issuer": {"name": a["csi.cert-manager.io/issuer-name"], "kind": a.get("csi.cert-manager.io/issuer-kind"),
                           "group": a.get("csi.cert-manager.io/issuer-group")},
                "commonName": fill(a.get("csi.cert-manager.io/common-name", "")),
                "dnsNames": [fill(n.strip()) for n in a.get("csi.cert-manager.io/dns-names", "").split(",") if n.strip()],
                "usages": [u.strip() for u in a.get("csi.cert-manager.io/key-usages", "").split(",") if u.strip()],
                "duration": a.get("csi.cert-manager.io/duration"),
            }


def _certificate_requests(docs, controller):
    for d in docs:
        if d["kind"] != "Certificate":
            continue
        s = d["spec"]
        usages = s.get("usages") or (["digital signature", "key encipherment"] + (["cert sign"] if s.get("isCA") else []))
        yield d, {"user": controller, "namespace": NAMESPACE, "issuer": s["issuerRef"], "commonName": s.get("commonName", ""),
                  "dnsNames": s.get("dnsNames") or [], "isCA": bool(s.get("isCA")), "usages": usages, "duration": s.get("duration")}


def check(render_set, fail):
    apis = ["--api-versions", "cert-manager.io/v1/Certificate", "--api-versions", CR_API]
    for sets in (["tls.certManager.enabled=true"],
                 ["tls.certManager.enabled=true", "tls.certManager.issuerRef.name=corp-ca", "tls.certManager.issuerRef.kind=ClusterIssuer",
                  "tls.certManager.nodeIssuerRef.name=corp-nodes", "tls.certManager.nodeIssuerRef.kind=ClusterIssuer",
                  "orchestrator.replicas=5"]):
        _check_render(render_set(sets, apis), " ".join(sets[1:]) or "defaults", fail)
    off = render_set(["tls.certManager.enabled=true", "tls.certManager.approverPolicy.enabled=false"], apis)
    if any(d["kind"] == "CertificateRequestPolicy" for d in off):
        fail("policy", "approverPolicy.enabled=false still renders CertificateRequestPolicies")


def _check_render(docs, label, fail):
    where = f"policy ({label})"
    if not any(d["kind"] == "CertificateRequestPolicy" for d in docs):
        fail(where, "no CertificateRequestPolicy rendered for a cluster that serves the API")
        return
    controller = ("cert-manager", "cert-manager")
    legit = list(_csi_requests(docs)) + list(_certificate_requests(docs, controller))
    tiers = {}
    for d, cr in legit:
        verdict, why = decide(docs, cr)
        if verdict != "approved":
            fail(where, f"{d['kind']} {d['metadata']['name']}'s own request is {verdict}: {why}")
        component = d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        if d["kind"] != "Certificate":
            tiers[component] = cr
    if set(tiers) != {"worker", "frontend"}:
        fail(where, f"CSI volumes found for {sorted(tiers)}, not worker and frontend")
        return
    worker, frontend = tiers["worker"], tiers["frontend"]
    cluster_issuer = next(cr["issuer"] for d, cr in legit if d["kind"] == "Certificate" and "orchestrator" in cr["commonName"])
    orch = next(cr for d, cr in legit if d["kind"] == "Certificate" and "orchestrator" in cr["commonName"])
    attacks = {
        "a worker pod asking a frontend's names": dict(worker, commonName=frontend["commonName"], dnsNames=frontend["dnsNames"]),
        "a frontend pod asking a worker's names": dict(frontend, commonName=worker["commonName"], dnsNames=worker["dnsNames"]),
        "a worker pod naming the cluster CA's issuer for an orchestrator's names":
            dict(worker, issuer=cluster_issuer, commonName=orch["commonName"], dnsNames=orch["dnsNames"]),
        "a worker pod naming the cluster CA's issuer for its own names": dict(worker, issuer=cluster_issuer),
        "a pod of another ServiceAccount asking a worker's names": dict(worker, user=(NAMESPACE, "default")),
        "a pod of another namespace's zl ServiceAccount": dict(worker, user=("elsewhere", worker["user"][1]), namespace="elsewhere"),
        "a worker pod asking a wildcard": dict(worker, commonName="*.worker.zl.internal", dnsNames=["worker.zl.internal", "*.worker.zl.internal"]),
        "a worker pod asking a name of two labels":
            dict(worker, commonName="x.frontend.zl.internal.worker.zl.internal", dnsNames=["worker.zl.internal", "x.frontend.zl.internal.worker.zl.internal"]),
        "a worker pod asking a name outside the cluster": dict(worker, dnsNames=worker["dnsNames"] + ["api.example.com"]),
        "a worker pod asking a CA": dict(worker, isCA=True, usages=worker["usages"] + ["cert sign"]),
        "a worker pod asking an IP name": dict(worker, ipAddresses=["10.0.0.1"]),
        "a worker pod asking a longer life": dict(worker, duration="87600h"),
        "cert-manager asking an orchestrator name the chart does not have":
            dict(orch, commonName="zl-zerolayer-orchestrator-9.orchestrator.zl.internal",
                 dnsNames=["orchestrator.zl.internal", "zl-zerolayer-orchestrator-9.orchestrator.zl.internal"]),
        "cert-manager asking a CA of orchestrator names": dict(orch, isCA=True, usages=["digital signature", "cert sign"]),
    }
    for what, cr in attacks.items():
        verdict, why = decide(docs, cr)
        if verdict == "approved":
            fail(where, f"{what} is approved (by {why})")


def self_test(fail):
    """The evaluator itself, on the semantics it stands in for."""
    if not (_wild("*.worker.zl.internal", "a.b.worker.zl.internal") and not _wild("*.worker.zl.internal", "worker.zl.internal")):
        fail("policy", "the wildcard matcher differs from approver-policy's (`*` matches any string, dots included)")
    if not _cel("self in ['a','b'] || self.matches('^c$')", "c") or _cel("self == 'a'", "b"):
        fail("policy", "the CEL subset evaluates wrongly")


def check_notes(helm, chart, fail):
    """`helm install` prints NOTES.txt (which `helm template` does not render): with cert-manager but no
    approver-policy API, it warns that pods may ask for any tier's names; with the API, it does not."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "chart")
        shutil.copytree(chart, copy)
        with open(os.path.join(copy, "templates", "NOTES.txt")) as f:
            notes = f.read()
        with open(os.path.join(copy, "templates", "zz-notes.yaml"), "w") as f:
            f.write('{{- define "zl.test.notes" }}' + notes + "{{- end }}\n"
                    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n"
                    '{{ include "zl.test.notes" . | indent 4 }}\n')
        base = [helm, "template", "zl", copy, "-n", NAMESPACE, "--show-only", "templates/zz-notes.yaml",
                "--set", "tls.certManager.enabled=true", "--api-versions", "cert-manager.io/v1/Certificate"]
        for apis, want in (([], True), (["--api-versions", CR_API], False)):
            out = subprocess.run(base + apis, capture_output=True, text=True)
            warned = "no CertificateRequestPolicy was rendered" in out.stdout
            if out.returncode != 0 or warned != want:
                fail("policy", f"NOTES.txt with{'out' if not apis else ''} the approver-policy API: warned={warned} {out.stderr[:300]}")
