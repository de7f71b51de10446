# One region of zerolayer: a namespace, the Secrets of its API keys and peers' CA, and the Helm release of the
# chart with this region's values. Cloud specifics (the Kubernetes cluster, DNS) stay with the caller.

locals {
  keys_secret = "${var.release_name}-fleet-keys"
  peer_ca     = "${var.release_name}-peer-ca"
  hop_key     = "${var.release_name}-hop-key"
}

# The values themselves come from a module with no provider (scripts/check-terraform plans it and renders them).
module "values" {
  source = "../zerolayer-values"

  region                = var.region
  release_name          = var.release_name
  namespace             = var.namespace
  image                 = var.image
  orchestrator_replicas = var.orchestrator_replicas
  worker_pools          = var.worker_pools
  frontend_replicas     = var.frontend_replicas
  frontend_host         = var.frontend_host
  frontend_extra_hosts  = var.frontend_extra_hosts
  ingress_class         = var.ingress_class
  frontend_tls          = var.frontend_tls
  peer_regions          = var.peer_regions
  peer_ca_secret        = var.peer_ca_pem == "" ? "" : local.peer_ca
  hop_key_secret        = length(var.peer_regions) > 0 ? local.hop_key : ""
  api_keys              = var.api_keys
  keys_secret           = local.keys_secret
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

resource "kubernetes_secret_v1" "hop_key" {
  count = length(var.peer_regions) > 0 ? 1 : 0

  metadata {
    name      = local.hop_key
    namespace = kubernetes_namespace_v1.this.metadata[0].name
  }
  data = { key = var.hop_key }
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
  values           = concat([module.values.yaml], var.extra_values)

  depends_on = [kubernetes_secret_v1.keys, kubernetes_secret_v1.peer_ca, kubernetes_secret_v1.hop_key]
}
