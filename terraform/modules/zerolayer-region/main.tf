# One region of zerolayer: a namespace, the Secrets of its API keys and peers' CA, and the Helm release of the
# chart with this region's values. Cloud specifics (the Kubernetes cluster, DNS) stay with the caller.

locals {
  keys_secret = "${var.release_name}-fleet-keys"
  peer_ca     = "${var.release_name}-peer-ca"

  values = {
    region = var.region
    image  = var.image
    orchestrator = {
      replicas = var.orchestrator_replicas
    }
    workers = length(var.worker_pools) > 0 ? { pools = var.worker_pools } : {}
    frontend = merge(
      {
        replicas     = var.frontend_replicas
        peerRegions  = var.peer_regions
        peerCaSecret = var.peer_ca_pem == "" ? "" : local.peer_ca
      },
      var.frontend_host == "" ? {} : {
        ingress = {
          enabled    = true
          className  = var.ingress_class
          host       = var.frontend_host
          extraHosts = var.frontend_extra_hosts
        }
      },
    )
    keys = [
      for k in var.api_keys : {
        id      = k.id
        project = k.project
        regions = k.regions
        secret  = { name = local.keys_secret, key = k.id }
      }
    ]
  }
}

resource "kubernetes_namespace_v1" "this" {
  metadata {
    name = var.namespace
    labels = {
      "app.kubernetes.io/part-of" = "zerolayer"
      "zerolayer.io/region"       = var.region
    }
  }
}

resource "kubernetes_secret_v1" "keys" {
  count = length(var.api_keys) > 0 ? 1 : 0

  metadata {
    name      = local.keys_secret
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }
  data = { for k in var.api_keys : k.id => var.api_key_secrets[k.id] }
  type = "Opaque"
}

resource "kubernetes_secret_v1" "peer_ca" {
  count = var.peer_ca_pem == "" ? 0 : 1

  metadata {
    name      = local.peer_ca
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }
  data = { "ca.pem" = var.peer_ca_pem }
  type = "Opaque"
}

resource "helm_release" "zerolayer" {
  name             = var.release_name
  namespace        = kubernetes_namespace_v1.this.metadata[0].name
  chart            = var.chart
  version          = var.chart_version
  create_namespace = false
  atomic           = true
  wait             = true
  timeout          = 900
  values           = concat([yamlencode(local.values)], var.extra_values)

  depends_on = [kubernetes_secret_v1.keys, kubernetes_secret_v1.peer_ca]
}
