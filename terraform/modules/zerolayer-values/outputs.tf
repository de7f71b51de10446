output "values" {
  description = "The chart values."
  value       = local.values
}

output "yaml" {
  description = "The chart values as YAML, for helm_release or `helm template -f`."
  value       = yamlencode(local.values)
}

output "endpoint" {
  description = "The region's API base URL: https on its Ingress host when it has TLS, http without; else the in-cluster Service."
  value       = var.frontend_host != "" ? "${var.frontend_tls == null ? "http" : "https"}://${var.frontend_host}" : "http://${local.fullname}-frontend.${var.namespace}.svc"
}
