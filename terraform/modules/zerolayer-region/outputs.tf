output "region" {
  description = "The region this installation serves."
  value       = var.region
}

output "endpoint" {
  description = "The region's API base URL: its Ingress host (https with TLS), else the in-cluster Service."
  value       = module.values.endpoint
}

output "namespace" {
  description = "The namespace the release is in."
  value       = kubernetes_namespace_v1.this.metadata[0].name
}
