variable "kubeconfig" {
  description = "The kubeconfig file with a context for each region's cluster."
  type        = string
  default     = "~/.kube/config"
}

variable "contexts" {
  description = "The kubeconfig context of each region's cluster."
  type = object({
    eu_west    = string
    eu_central = string
    us_east    = string
  })
}

variable "domain" {
  description = "The public DNS zone (Route 53) the API lives under: api.DOMAIN with latency routing, REGION.DOMAIN per region."
  type        = string
}

variable "zone_id" {
  description = "The Route 53 hosted zone id of var.domain."
  type        = string
}

variable "ingress_hostnames" {
  description = "Each region's ingress load balancer host name (what its Ingress controller publishes), by region."
  type        = map(string)
}

variable "chart" {
  description = "The zerolayer chart (a checkout's helm/zerolayer, or a repository chart)."
  type        = string
  default     = "../../../helm/zerolayer"
}

variable "peer_ca_pem" {
  description = "The CA that the regions' public API certificates chain to, for spillover between regions over https."
  type        = string
}

variable "api_key_secrets" {
  description = "The secret of each API key, by key id (the same in every region)."
  type        = map(string)
  sensitive   = true
}

variable "cluster_issuer" {
  description = "The cert-manager ClusterIssuer that issues each region's API certificate (e.g. letsencrypt-prod)."
  type        = string
}

variable "hop_key" {
  description = "The key (at least 32 bytes) every region's frontends sign region hops with."
  type        = string
  sensitive   = true
}
