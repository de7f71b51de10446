output "regions" {
  description = "Per region, the inputs of modules/zerolayer-region: region, url, worker_pools, peer_regions (nearest first), api_keys."
  value       = local.settings
}

output "peers" {
  description = "Each region's peers, nearest first."
  value       = local.peers
}
