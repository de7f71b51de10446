# The fleet: what each region runs and how they relate. Kept apart from the providers (main.tf) so that
# scripts/check-terraform can plan it with no cloud access and render every region's chart values.

locals {
  gpu_pool = [{
    name        = "gpu"
    deviceClass = "gpu"
    device      = "cuda:0"
    replicas    = 4
    models      = ["llama-3.1-8b=/models/llama-3.1-8b-instruct"]
    modelVolume = { persistentVolumeClaim = { claimName = "models" } }
    resources   = { requests = { cpu = "8", memory = "32Gi" }, limits = { memory = "64Gi", "nvidia.com/gpu" = "1" } }
    kvMemoryMb  = 65536
    maxRunning  = 128
    # A full GPU pool has no room for a surge pod: roll it one pod at a time.
    rollout = { maxSurge = 0, maxUnavailable = 1 }
  }]
  cpu_pool = [{
    name     = "cpu"
    replicas = 2
  }]

  # What each region's installation takes besides the fleet's settings: its API host names and TLS (peers reach
  # each other over https, so every region's Ingress has a certificate).
  region_inputs = {
    for name in ["eu-west", "eu-central", "us-east"] : name => {
      frontend_host        = "${name}.${var.domain}"
      frontend_extra_hosts = ["api.${var.domain}"]
      ingress_class        = "nginx"
      frontend_tls         = { secret = "zerolayer-api-tls", cluster_issuer = var.cluster_issuer }
    }
  }
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
