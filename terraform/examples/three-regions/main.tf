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
  hop_key         = var.hop_key
  frontend_host   = local.region_inputs["eu-west"].frontend_host
  ingress_class   = local.region_inputs["eu-west"].ingress_class
  frontend_tls    = local.region_inputs["eu-west"].frontend_tls

  frontend_extra_hosts = local.region_inputs["eu-west"].frontend_extra_hosts
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
  hop_key         = var.hop_key
  frontend_host   = local.region_inputs["eu-central"].frontend_host
  ingress_class   = local.region_inputs["eu-central"].ingress_class
  frontend_tls    = local.region_inputs["eu-central"].frontend_tls

  frontend_extra_hosts = local.region_inputs["eu-central"].frontend_extra_hosts
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
  hop_key         = var.hop_key
  frontend_host   = local.region_inputs["us-east"].frontend_host
  ingress_class   = local.region_inputs["us-east"].ingress_class
  frontend_tls    = local.region_inputs["us-east"].frontend_tls

  frontend_extra_hosts = local.region_inputs["us-east"].frontend_extra_hosts
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
