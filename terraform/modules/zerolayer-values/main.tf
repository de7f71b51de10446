# One region's chart values, computed from typed inputs with no provider: modules/zerolayer-region installs them,
# and scripts/check-terraform plans this module and renders its output with `helm template` (the chart's schema).

locals {
  https_peers = [for p in var.peer_regions : p if startswith(p.url, "https://")]

  issuer = try(var.frontend_tls.cluster_issuer, "")
  # (`for` over one-key objects: a conditional between {} and an object with keys has no common type.)
  ingress = {
    for k, v in {
      ingress = {
        enabled     = true
        className   = var.ingress_class
        host        = var.frontend_host
        extraHosts  = var.frontend_extra_hosts
        tlsSecret   = try(var.frontend_tls.secret, "")
        annotations = local.issuer == "" ? tomap({}) : tomap({ "cert-manager.io/cluster-issuer" = local.issuer })
      }
    } : k => v if var.frontend_host != ""
  }

  values = {
    region = var.region
    image  = var.image
    orchestrator = {
      replicas = var.orchestrator_replicas
    }
    workers = { for k, v in { pools = var.worker_pools } : k => v if length(var.worker_pools) > 0 }
    frontend = merge(
      {
        replicas     = var.frontend_replicas
        peerRegions  = var.peer_regions
        peerCaSecret = var.peer_ca_secret
        hopKeySecret = var.hop_key_secret
      },
      local.ingress,
    )
    keys = [
      for k in var.api_keys : {
        id      = k.id
        project = k.project
        regions = k.regions
        secret  = { name = var.keys_secret, key = k.id }
      }
    ]
  }

  # The chart's names (its zl.fullname): the release name when it holds the chart's, else RELEASE-zerolayer, at
  # most 39 characters.
  fullname = trimsuffix(substr(strcontains(var.release_name, "zerolayer") ? var.release_name : "${var.release_name}-zerolayer", 0, 39), "-")
}

check "https_peers_have_a_ca" {
  assert {
    condition     = length(local.https_peers) == 0 || var.peer_ca_secret != ""
    error_message = "Peer regions are reached over https, but no peer_ca_secret names the CA their certificates chain to."
  }
}

check "peers_have_a_hop_key" {
  assert {
    condition     = length(var.peer_regions) == 0 || var.hop_key_secret != ""
    error_message = "Peer regions need hop_key_secret: the key every region's frontends sign hops with."
  }
}
