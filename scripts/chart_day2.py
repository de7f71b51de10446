"""Day-2 checks of the rendered chart (scripts/check-chart runs them): what scaling, upgrading and running it for
months need, which schemas and wiring cannot see.

- the orchestrators' membership follows the StatefulSet: `raft-auto-join` in their config, a pre-upgrade Job that
  trims the Raft group to `orchestrator.replicas` before the StatefulSet shrinks, a scaled-away member's volume
  deleted with it, a PodDisruptionBudget that keeps a majority of the voters;
- the first key's bootstrap runs on install and upgrade, idempotently (an existing project left as it is);
- with the frontend HPA, the fallback share of a rate limit is 1/maxReplicas (limits tighten, never loosen);
- every tier's pods roll when anything their config holds changes: rendered with 3 and 5 orchestrators, every
  worker and frontend pod template's config checksum differs (they hold the orchestrators' list).
"""
import re

import yaml


def _config(docs, component):
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component:
            return d.get("data", {}).get("config.toml", "")
    return None


def _hook_jobs(docs):
    for d in docs:
        if d["kind"] == "Job":
            hooks = (d["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
            yield d, {h.strip() for h in hooks.split(",") if h.strip()}


def _commands(job):
    spec = job["spec"]["template"]["spec"]
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        yield [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]


def check(name, docs, values, fail):
    orch = values.get("orchestrator") or {}
    replicas = int(orch.get("replicas", 3))
    config = _config(docs, "orchestrator")
    if config is not None and not re.search(r"^\s*raft-auto-join\s*=\s*true\s*$", config, re.M):
        fail(name, "the orchestrators' config lacks raft-auto-join = true: a new ordinal starts no member of the group")
    trims = [
        cmd for job, hooks in _hook_jobs(docs) if "pre-upgrade" in hooks for cmd in _commands(job)
        if "members" in cmd and "trim" in cmd
    ]
    if not any(cmd[-1] == str(replicas) for cmd in trims):
        fail(name, f"no pre-upgrade Job runs `zl admin members trim {replicas}`: members are not removed before the StatefulSet shrinks")
    for d in docs:
        if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-orchestrator"):
            policy = d["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
            if policy.get("whenScaled") != "Delete":
                fail(name, "the orchestrator StatefulSet keeps a scaled-away member's volume (persistentVolumeClaimRetentionPolicy.whenScaled)")
        if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"].endswith("-orchestrator"):
            if d["spec"].get("minAvailable") != replicas // 2 + 1:
                fail(name, f"the orchestrator PDB's minAvailable is not a majority of {replicas} voters")
    for job, hooks in _hook_jobs(docs):
        cmds = list(_commands(job))
        if any("keys" in c and "ensure" in c for c in cmds):
            if not {"post-install", "post-upgrade"} <= hooks:
                fail(name, f"the bootstrap Job runs on {sorted(hooks)}, not on install and upgrade")
            if any("project" in c and "--if-missing" not in c for c in cmds):
                fail(name, "the bootstrap Job resets the default project's quota on every run (project --if-missing)")
    tls = values.get("tls") or {}
    if not (tls.get("certManager") or {}).get("enabled") and (tls.get("job") or {}).get("enabled", True):
        renewing = [d for d in docs if d["kind"] == "CronJob" and any(
            "certs" in c.get("command", []) for c in d["spec"]["jobTemplate"]["spec"]["template"]["spec"].get("initContainers", []))]
        if not renewing:
            fail(name, "certificates from the chart's Job are reissued on upgrades only: no CronJob renews them (tls.job.renewSchedule)")
    frontend = values.get("frontend") or {}
    auto = frontend.get("autoscaling") or {}
    fconfig = _config(docs, "frontend")
    if fconfig is not None and auto.get("enabled"):
        m = re.search(r"^\s*replicas\s*=\s*(\d+)", fconfig, re.M)
        if not m or int(m.group(1)) != int(auto.get("maxReplicas", 10)):
            fail(name, "with the frontend HPA, the rate-limit fallback share is not 1/maxReplicas (limits loosen as it scales)")


def _checksums(docs):
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            ann = d["spec"]["template"]["metadata"].get("annotations") or {}
            out[d["metadata"]["name"]] = ann.get("checksum/config")
    return out


def check_scaling(render_set, fail):
    """`render_set(extra_args)` renders the default values with `--set` flags and returns the documents."""
    three, five = _checksums(render_set(["orchestrator.replicas=3"])), _checksums(render_set(["orchestrator.replicas=5"]))
    for name, before in three.items():
        if name.endswith("-orchestrator"):
            continue
        if before is None or before == five.get(name):
            fail("scaling", f"{name}'s pods do not roll when the orchestrator count changes (its config lists them)")


def _selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_operations(name, docs, values, fail):
    """Scaling and scraping: KEDA reads a scrape that exists with a query that matches its pool alone, each pod is
    scraped once, metrics are admitted from the namespaces documented, worker pools have disruption budgets and
    rollouts that can proceed, and each pool's pass-through values reach its pods."""
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
    monitors = by_kind.get("ServiceMonitor", [])
    for so in by_kind.get("ScaledObject", []):
        if not monitors:
            fail(name, f"ScaledObject {so['metadata']['name']} queries Prometheus, but no ServiceMonitor makes it scrape the workers")
        target = so["spec"]["scaleTargetRef"]["name"]
        deploy = next((d for d in workloads if d["metadata"]["name"] == target), None)
        labels = deploy["spec"]["template"]["metadata"].get("labels", {}) if deploy else {}
        copied = {l for m in monitors for l in m["spec"].get("podTargetLabels", [])}
        for trig in so["spec"]["triggers"]:
            query = trig["metadata"].get("query", "")
            # The pool is selected by equality on labels every series of its pods carries, and nothing else's.
            for label in ("app.kubernetes.io/instance", "zerolayer.dev/pool"):
                series = re.sub(r"[^a-zA-Z0-9_]", "_", label)
                if f'{series}="{labels.get(label)}"' not in query or label not in copied:
                    fail(name, f"ScaledObject {target}: its query does not select exactly its pool's pods ({series}=\"{labels.get(label)}\", copied by the ServiceMonitor)")
    for mon in monitors:
        sel = mon["spec"]["selector"].get("matchLabels", {})
        ports = {e.get("port") for e in mon["spec"]["endpoints"]}
        scraped = [s for s in by_kind.get("Service", []) if _selects(sel, s["metadata"].get("labels", {}))
                   and any(p.get("name") in ports for p in s["spec"].get("ports", []))]
        for w in workloads:
            labels = w["spec"]["template"]["metadata"].get("labels", {})
            hits = [s["metadata"]["name"] for s in scraped if _selects(s["spec"].get("selector"), labels)]
            if len(hits) > 1:
                fail(name, f"{w['metadata']['name']}'s pods are scraped {len(hits)} times ({', '.join(hits)}): every series twice")
    for np in by_kind.get("NetworkPolicy", []):
        for rule in np["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "namespaceSelector" in peer and not peer["namespaceSelector"]:
                    fail(name, f"NetworkPolicy {np['metadata']['name']} admits every namespace (an empty namespaceSelector)")
    pdbs = by_kind.get("PodDisruptionBudget", [])
    scaled = {h["spec"]["scaleTargetRef"]["name"] for h in by_kind.get("HorizontalPodAutoscaler", []) + by_kind.get("ScaledObject", [])}
    pools = {p["name"]: p for p in (values.get("workers") or {}).get("pools", [])}
    for d in by_kind.get("Deployment", []):
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        if labels.get("app.kubernetes.io/component") != "worker":
            continue
        wname, spec = d["metadata"]["name"], d["spec"]["template"]["spec"]
        if (d["spec"].get("replicas", 1) > 1 or wname in scaled) and not any(
            _selects(p["spec"]["selector"].get("matchLabels"), labels) for p in pdbs
        ):
            fail(name, f"{wname} has no PodDisruptionBudget: a node drain may take every pod of the pool at once")
        ru = d["spec"].get("strategy", {}).get("rollingUpdate", {})
        limits = (spec["containers"][0].get("resources") or {}).get("limits") or {}
        if "nvidia.com/gpu" in limits and ru.get("maxUnavailable", 0) in (0, "0%"):
            fail(name, f"{wname}: a full GPU pool cannot roll with maxUnavailable 0 (there is no GPU for a surge pod)")
        pool = pools.get(labels.get("zerolayer.dev/pool"), {})
        container = spec["containers"][0]
        for key in ("runtimeClassName", "priorityClassName"):
            if pool.get(key) and spec.get(key) != pool[key]:
                fail(name, f"{wname}: {key} {pool[key]!r} does not reach the pods")
        annotations = d["spec"]["template"]["metadata"].get("annotations") or {}
        for k, v in (pool.get("podAnnotations") or {}).items():
            if annotations.get(k) != v:
                fail(name, f"{wname}: pod annotation {k} does not reach the pods")
        env = {e["name"] for e in container.get("env", [])}
        for e in pool.get("extraEnv") or []:
            if e["name"] not in env:
                fail(name, f"{wname}: extraEnv {e['name']} does not reach the container")
        tag = (pool.get("image") or {}).get("tag")
        if tag and not container["image"].endswith(":" + tag):
            fail(name, f"{wname}: the pool's image tag {tag} is not its image ({container['image']})")


def check_names(render_release, fail):
    """`render_release(name)` renders the default values as release `name`. The longest release name Helm takes
    (53 characters) still gives objects Kubernetes can create, and pods it can name."""
    docs = render_release("a" * 53)
    for d in docs:
        n, kind = d["metadata"]["name"], d["kind"]
        # A StatefulSet's pods get controller-revision-hash: NAME-HASH (up to 11 more characters), a label value.
        limit = 52 if kind == "StatefulSet" else 63 if kind in ("Service", "Pod") else 253
        if len(n) > limit:
            fail("names", f"{kind} {n} is {len(n)} characters; Kubernetes takes at most {limit} there")


def check_test_pod(name, docs, fail):
    """`helm test` sends one request through the frontends' Service."""
    tests = [d for d in docs if d["kind"] == "Pod" and (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    ok = False
    for pod in tests:
        for c in pod["spec"]["containers"]:
            cmd = [str(a) for a in c.get("command", [])]
            urls = [a for a in cmd if a.startswith("http://")]
            if "--prompt" in cmd and urls and urls[0][len("http://"):].split(":")[0] in services:
                ok = True
    if not ok:
        fail(name, "no `helm test` pod sends a request through the frontends' Service")


def check_gitops(render_set, fail):
    """GitOps tools render the chart without a cluster (`lookup` finds nothing) on every sync: with the first key
    from an existing Secret, two renders are identical, so nothing changes between syncs."""
    sets = ["apiKey.existingSecret=zl-first-key", "keyPepper.existingSecret=zl-key-pepper"]
    first, second = render_set(sets), render_set(sets)
    if yaml.safe_dump_all(first) != yaml.safe_dump_all(second):
        changed = sorted({f"{a['kind']} {a['metadata']['name']}" for a, b in zip(first, second) if a != b})
        fail("gitops", f"two renders with apiKey.existingSecret differ ({', '.join(changed)}): every sync would change them")


def check_ca_minting(render_set, fail):
    """Only a first install's certificate Job may mint the cluster CA: an upgrade's Job and the renewal CronJob
    that cannot read the CA Secret fail (`--require-ca`), since running nodes trust only the CA they started with."""
    def certs_args(docs):
        found = {}
        for d in docs:
            name = d["metadata"]["name"]
            if d["kind"] == "Job" and name.endswith("-certs"):
                found["job"] = [a for cmd in _commands(d) for a in cmd]
            if d["kind"] == "CronJob" and name.endswith("-certs-renew"):
                spec = d["spec"]["jobTemplate"]["spec"]
                found["cron"] = [a for cmd in _commands({"spec": spec}) for a in cmd]
        return found
    install = certs_args(render_set([]))
    upgrade = certs_args(render_set([], ["--is-upgrade"]))
    if "job" not in install or "cron" not in install:
        fail("ca", "the default render has no certificate Job and renewal CronJob")
        return
    if "--require-ca" in install["job"]:
        fail("ca", "the first install's certificate Job cannot mint the cluster CA")
    if "--require-ca" not in upgrade.get("job", []):
        fail("ca", "an upgrade's certificate Job may mint a new CA over the running cluster")
    if "--require-ca" not in install["cron"]:
        fail("ca", "the renewal CronJob may mint a new CA over the running cluster")


def check_csi_issuer(render_set, fail):
    """With cert-manager, workers' and frontends' CSI certificates come from an intermediate CA name-constrained to
    their two roles, so a pod cannot get an orchestrator's or the admin's name that nodes would accept."""
    docs = render_set(["tls.certManager.enabled=true"], ["--api-versions", "cert-manager.io/v1/Certificate"])
    nodes_ca = [d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"].endswith("-nodes-ca")]
    if len(nodes_ca) != 1:
        fail("csi", "no name-constrained nodes CA Certificate")
        return
    constraints = nodes_ca[0]["spec"].get("nameConstraints") or {}
    permitted = sorted((constraints.get("permitted") or {}).get("dnsDomains") or [])
    if not constraints.get("critical") or permitted != ["frontend.zl.internal", "worker.zl.internal"]:
        fail("csi", f"the nodes CA's name constraints are {constraints}")
    issuers = set()
    for d in docs:
        spec = (d.get("spec") or {}).get("template", {}).get("spec", {}) if d["kind"] in ("Deployment", "StatefulSet") else {}
        for v in spec.get("volumes", []):
            if (v.get("csi") or {}).get("driver") == "csi.cert-manager.io":
                issuers.add(v["csi"]["volumeAttributes"]["csi.cert-manager.io/issuer-name"])
    if issuers != {nodes_ca[0]["metadata"]["name"][: -len("-ca")]}:
        fail("csi", f"CSI volumes ask {sorted(issuers)}, not the name-constrained nodes issuer")


def check_alerts(render_set, fail):
    """The PrometheusRule watches what an SRE must hear of: a dead Raft task, commit lag, expiring or untrusted
    certificates, and every tier's workload kind (frontends are a StatefulSet by default)."""
    docs = render_set(["metrics.prometheusRule.enabled=true"], ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"])
    rules = [r for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"] for r in g["rules"]]
    by_name = {r.get("alert"): r["expr"] for r in rules}
    for alert in ["ZerolayerRaftFatal", "ZerolayerRaftCommitLag", "ZerolayerCertificateExpiring", "ZerolayerCertificateUntrusted"]:
        if alert not in by_name:
            fail("alerts", f"no {alert} alert")
    tier_down = by_name.get("ZerolayerTierDown", "")
    frontend = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("-frontend")]
    if frontend and "kube_statefulset_status_replicas_ready" not in tier_down or (frontend and "-frontend" not in tier_down.split("kube_deployment")[0]):
        fail("alerts", "ZerolayerTierDown does not watch the frontends' StatefulSet")
    if "quantile=" in " ".join(by_name.values()):
        fail("alerts", "an alert reads a summary's quantile: latencies are histograms (histogram_quantile)")
