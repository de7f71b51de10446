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
