output "endpoints" {
  description = "Each region's API endpoint."
  value = {
    (module.eu_west.region)    = module.eu_west.endpoint
    (module.eu_central.region) = module.eu_central.endpoint
    (module.us_east.region)    = module.us_east.endpoint
  }
}

output "api" {
  description = "The latency-routed public API."
  value       = "https://api.${var.domain}"
}
