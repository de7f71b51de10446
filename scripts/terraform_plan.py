"""What scripts/check-terraform runs with the `terraform` binary: `init -backend=false` and `validate` of every
module that needs no provider (the fleet's and the values'), and a `plan` of the example's fleet (its fleet.tf,
which holds no provider) with every region's chart values computed by modules/zerolayer-values, each then rendered
with `helm template` against the chart's schema. Provider-backed modules (the region's Kubernetes and Helm
resources, the example's Route 53 records) are not planned: their providers cannot be downloaded here."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import yaml

PROVIDER_FREE = ["modules/zerolayer-fleet", "modules/zerolayer-values"]
EXAMPLE = "examples/three-regions"

# Per region, what modules/zerolayer-region passes modules/zerolayer-values besides the fleet's settings (the
# example's local.region_inputs).
CHECK_ROOT = """
variable "domain" {
  type = string
}

variable "cluster_issuer" {
  type = string
}

module "values" {
  for_each = module.fleet.regions
  source   = "%(values)s"

  region               = each.value.region
  worker_pools         = each.value.worker_pools
  peer_regions         = each.value.peer_regions
  api_keys             = each.value.api_keys
  frontend_host        = local.region_inputs[each.key].frontend_host
  frontend_extra_hosts = local.region_inputs[each.key].frontend_extra_hosts
  ingress_class        = local.region_inputs[each.key].ingress_class
  frontend_tls         = local.region_inputs[each.key].frontend_tls
  peer_ca_secret       = "zl-peer-ca"
  hop_key_secret       = length(each.value.peer_regions) > 0 ? "zl-hop-key" : ""
  keys_secret          = "zl-fleet-keys"
}

output "values" {
  value = { for k, v in module.values : k => v.yaml }
}

output "endpoints" {
  value = { for k, v in module.values : k => v.endpoint }
}
"""


def terraform():
    return shutil.which("terraform") or ("/usr/local/bin/terraform" if os.path.exists("/usr/local/bin/terraform") else None)


def run(args, cwd, env):
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)


def check(tf_dir, chart, helm, fail):
    """Returns a one-line summary; problems go to `fail(where, what)`."""
    binary = terraform()
    if binary is None:
        fail("terraform", "the terraform binary is missing: validate and plan cannot run (install terraform >= 1.5)")
        return "no terraform"
    with tempfile.TemporaryDirectory() as tmp:
        rc = os.path.join(tmp, "terraformrc")
        open(rc, "w").close()
        env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1", "TF_CLI_CONFIG_FILE": rc,
               "TF_DATA_DIR": os.path.join(tmp, "data")}
        for module in PROVIDER_FREE:
            if not os.path.isdir(os.path.join(tf_dir, module)):
                fail(module, "missing: the chart values must come from a module with no provider, to be planned here")
                continue
            work = os.path.join(tmp, module.replace("/", "_"))
            shutil.copytree(os.path.join(tf_dir, module), work)
            for step in (["init", "-backend=false", "-input=false", "-no-color"], ["validate", "-no-color"]):
                out = run([binary, *step], work, env)
                if out.returncode != 0:
                    fail(module, f"terraform {step[0]}: {(out.stdout + out.stderr).strip()[-1500:]}")
                    break
            shutil.rmtree(env["TF_DATA_DIR"], ignore_errors=True)
        root = os.path.join(tmp, "plan")
        os.makedirs(root)
        fleet_path = os.path.join(tf_dir, EXAMPLE, "fleet.tf")
        if not os.path.exists(fleet_path):
            fail(EXAMPLE, "no fleet.tf: the fleet's call and its inputs must stand apart from the providers to be planned")
            return "no plan"
        fleet = open(fleet_path).read()
        modules = os.path.join(tf_dir, "modules")
        fleet = re.sub(r'source\s*=\s*"\.\./\.\./modules/([^"]+)"', lambda m: f'source = "{os.path.join(modules, m.group(1))}"', fleet)
        open(os.path.join(root, "fleet.tf"), "w").write(fleet)
        open(os.path.join(root, "check.tf"), "w").write(CHECK_ROOT % {"values": os.path.join(modules, "zerolayer-values")})
        plan = os.path.join(tmp, "plan.bin")
        steps = [
            ["init", "-backend=false", "-input=false", "-no-color"],
            ["plan", "-input=false", "-no-color", "-lock=false", f"-out={plan}", "-var", "domain=example.com",
             "-var", "cluster_issuer=letsencrypt"],
            ["show", "-json", plan],
        ]
        shown = None
        for step in steps:
            out = run([binary, *step], root, env)
            if out.returncode != 0:
                fail(f"{EXAMPLE}/fleet.tf", f"terraform {step[0]}: {(out.stdout + out.stderr).strip()[-1500:]}")
                return "plan failed"
            shown = out.stdout
        outputs = json.loads(shown)["planned_values"]["outputs"]
        values, endpoints = outputs["values"]["value"], outputs["endpoints"]["value"]
        for region, text in sorted(values.items()):
            where = f"{EXAMPLE}: region {region}"
            path = os.path.join(tmp, f"{region}.yaml")
            open(path, "w").write(text)
            out = run([helm, "template", "zl", chart, "-n", "zerolayer", "-f", path], tmp, env)
            if out.returncode != 0:
                fail(where, f"its chart values fail helm template: {out.stderr.strip()[-1500:]}")
            v = yaml.safe_load(text) or {}
            frontend = v.get("frontend") or {}
            https = [p for p in frontend.get("peerRegions") or [] if str(p.get("url", "")).startswith("https://")]
            if https and not (frontend.get("ingress") or {}).get("tlsSecret"):
                fail(where, "peers reach it over https, but its Ingress has no TLS (frontend_tls)")
            for pool in (v.get("workers") or {}).get("pools") or []:
                if pool.get("deviceClass") == "gpu" and not str(pool.get("device", "")).startswith("cuda"):
                    fail(where, f"GPU pool {pool.get('name')} runs on {pool.get('device', 'cpu')!r}: give it device cuda:N")
            if not endpoints.get(region, "").startswith("https://"):
                fail(where, f"its endpoint output {endpoints.get(region)!r} is not its https API URL")
        return f"terraform validate ({len(PROVIDER_FREE)} modules) and plan ({len(values)} regions' values through helm template) ok"
