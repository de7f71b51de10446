# A fleet of regions from one map: what each region's installation (modules/zerolayer-region) needs to be
# consistent with the others. Terraform cannot create providers in a loop, so this module computes and the caller
# installs each region with its own provider (examples/three-regions).

locals {
  names = sort(keys(var.regions))

  # Each region's peers, nearest first: its `nearest` list, then the rest by name.
  peers = {
    for name, r in var.regions : name => concat(
      r.nearest,
      [for other in local.names : other if other != name && !contains(r.nearest, other)],
    )
  }

  unknown_key_regions = distinct(flatten([
    for k in var.api_keys : [for r in k.regions : r if !contains(local.names, r)]
  ]))

  settings = {
    for name, r in var.regions : name => {
      region       = name
      url          = r.url
      worker_pools = r.worker_pools
      peer_regions = var.spillover ? [for p in local.peers[name] : { region = p, url = var.regions[p].url }] : []
      api_keys     = var.api_keys
    }
  }
}

check "key_regions_exist" {
  assert {
    condition     = length(local.unknown_key_regions) == 0
    error_message = "API keys are bound to regions outside the fleet: ${join(", ", local.unknown_key_regions)}."
  }
}
