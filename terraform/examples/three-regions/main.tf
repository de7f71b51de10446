# Three regions, each its own Kubernetes cluster and zerolayer installation (its own orchestrator Raft group),
# spilling over to each other, with a key bound to the EU regions, and one public name routed to the nearest
# region by latency. The cloud-specific parts (the clusters, which exist already here; Route 53) live in this
# example, not in the modules.

provider "aws" {}

provider "kubernetes" {
  alias          = "eu_west"
  config_path    = var.kubeconfig
  config_context = var.contexts.eu_west
}

provider "helm" {
  alias = "eu_west"
  kubernetes {
    config_path    = var.kubeconfig
    config_context = var.contexts.eu_west
  }
}

provider "kubernetes" {
  alias          = "eu_central"
  config_path    = var.kubeconfig
  config_context = var.contexts.eu_central
}

provider "helm" {
  alias = "eu_central"
  kubernetes {
    config_path    = var.kubeconfig
    config_context = var.contexts.eu_central
  }
}

provider "kubernetes" {
  alias          = "us_east"
  config_path    = var.kubeconfig
  config_context = var.contexts.us_east
}

provider "helm" {
  alias = "us_east"
  kubernetes {
    config_path    = var.kubeconfig
    config_context = var.contexts.us_east
  }
}

locals {
  gpu_pool = [{
    name        = "gpu"
    deviceClass = "gpu"
    replicas    = 4
    models      = ["llama-3.1-8b=/models/llama-3.1-8b-instruct"]
    modelVolume = { persistentVolumeClaim = { claimName = "models" } }
    resources   = { limits = { "nvidia.com/gpu" = 1 } }
  }]
  cpu_pool = [{
    name     = "cpu"
    replicas = 2
  }]
}

module "fleet" {
  source = "../../modules/zerolayer-fleet"

  regions = {
    "eu-west"    = { url = "https://eu-west.${var.domain}", worker_pools = local.gpu_pool, nearest = ["eu-central", "us-east"] }
    "eu-central" = { url = "https://eu-central.${var.domain}", worker_pools = local.gpu_pool, nearest = ["eu-west", "us-east"] }
    "us-east"    = { url = "https://us-east.${var.domain}", worker_pools = concat(local.gpu_pool, local.cpu_pool), nearest = ["eu-west", "eu-central"] }
  }
  api_keys = [
    { id = "acme-eu", regions = ["eu-west", "eu-central"] },
    { id = "globex" },
  ]
}

module "eu_west" {
  source    = "../../modules/zerolayer-region"
  providers = { kubernetes = kubernetes.eu_west, helm = helm.eu_west }

  region          = module.fleet.regions["eu-west"].region
  chart           = var.chart
  worker_pools    = module.fleet.regions["eu-west"].worker_pools
  peer_regions    = module.fleet.regions["eu-west"].peer_regions
  peer_ca_pem     = var.peer_ca_pem
  api_keys        = module.fleet.regions["eu-west"].api_keys
  api_key_secrets = var.api_key_secrets
  frontend_host   = "eu-west.${var.domain}"
  ingress_class   = "nginx"

  frontend_extra_hosts = ["api.${var.domain}"]
}

module "eu_central" {
  source    = "../../modules/zerolayer-region"
  providers = { kubernetes = kubernetes.eu_central, helm = helm.eu_central }

  region          = module.fleet.regions["eu-central"].region
  chart           = var.chart
  worker_pools    = module.fleet.regions["eu-central"].worker_pools
  peer_regions    = module.fleet.regions["eu-central"].peer_regions
  peer_ca_pem     = var.peer_ca_pem
  api_keys        = module.fleet.regions["eu-central"].api_keys
  api_key_secrets = var.api_key_secrets
  frontend_host   = "eu-central.${var.domain}"
  ingress_class   = "nginx"

  frontend_extra_hosts = ["api.${var.domain}"]
}

module "us_east" {
  source    = "../../modules/zerolayer-region"
  providers = { kubernetes = kubernetes.us_east, helm = helm.us_east }

  region          = module.fleet.regions["us-east"].region
  chart           = var.chart
  worker_pools    = module.fleet.regions["us-east"].worker_pools
  peer_regions    = module.fleet.regions["us-east"].peer_regions
  peer_ca_pem     = var.peer_ca_pem
  api_keys        = module.fleet.regions["us-east"].api_keys
  api_key_secrets = var.api_key_secrets
  frontend_host   = "us-east.${var.domain}"
  ingress_class   = "nginx"

  frontend_extra_hosts = ["api.${var.domain}"]
}

# Each region's own name, and one public name answered by the region with the lowest latency to the client.
resource "aws_route53_record" "region" {
  for_each = var.ingress_hostnames

  zone_id = var.zone_id
  name    = "${each.key}.${var.domain}"
  type    = "CNAME"
  ttl     = 60
  records = [each.value]
}

resource "aws_route53_record" "api" {
  for_each = var.ingress_hostnames

  zone_id        = var.zone_id
  name           = "api.${var.domain}"
  type           = "CNAME"
  ttl            = 60
  records        = [each.value]
  set_identifier = each.key

  latency_routing_policy {
    region = lookup({ "eu-west" = "eu-west-1", "eu-central" = "eu-central-1", "us-east" = "us-east-1" }, each.key, each.key)
  }
}
