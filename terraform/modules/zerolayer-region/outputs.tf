output "region" {
  description = "The region this installation serves."
  value       = var.region
}

output "endpoint" {
  description = "The region's API base URL: its Ingress host, else the in-cluster Service."
  value       = var.frontend_host != "" ? "https://${var.frontend_host}" : "http://${var.release_name}-zerolayer-frontend.${var.namespace}.svc"
}

output "namespace" {
  description = "The namespace the release is in."
  value       = kubernetes_namespace_v1.this.metadata[0].name
}
