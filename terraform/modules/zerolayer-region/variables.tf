variable "region" {
  description = "The region this installation serves (a-z, 0-9, '-', '_', '.'): one orchestrator Raft group, its own keys, its own workers."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{0,63}$", var.region))
    error_message = "A region name is 1 to 64 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit."
  }
}

variable "namespace" {
  description = "The Kubernetes namespace to create and install into."
  type        = string
  default     = "zerolayer"
}

variable "release_name" {
  description = "The Helm release name."
  type        = string
  default     = "zl"
}

variable "chart" {
  description = "The zerolayer chart: a path (helm/zerolayer of a checkout) or a chart reference in a repository."
  type        = string
}

variable "chart_version" {
  description = "The chart version when var.chart names a repository chart; null for a path."
  type        = string
  default     = null
}

variable "image" {
  description = "The zerolayer image: repository and tag (empty tag: the chart's appVersion)."
  type = object({
    repository = string
    tag        = optional(string, "")
  })
  default = {
    repository = "ghcr.io/zerolayer/zerolayer"
  }
}

variable "orchestrator_replicas" {
  description = "Orchestrators in this region's Raft group: 3 or 5 (1 only for a toy install)."
  type        = number
  default     = 3

  validation {
    condition     = contains([1, 3, 5], var.orchestrator_replicas)
    error_message = "Use 1, 3 or 5 orchestrators."
  }
}

variable "worker_pools" {
  description = "This region's worker pools (model placement), as the chart's workers.pools: name, deviceClass, replicas, models, resources, ..."
  type        = any
  default     = []
}

variable "frontend_replicas" {
  description = "Frontend replicas in this region."
  type        = number
  default     = 2
}

variable "frontend_host" {
  description = "The host name of this region's API; with ingress_class it gets an Ingress. Empty: no Ingress."
  type        = string
  default     = ""
}

variable "frontend_extra_hosts" {
  description = "More host names for the API's Ingress, e.g. the fleet's latency-routed name."
  type        = list(string)
  default     = []
}

variable "ingress_class" {
  description = "The IngressClass of the API's Ingress (with frontend_host)."
  type        = string
  default     = ""
}

variable "peer_regions" {
  description = "Peer regions' frontends, nearest first, for spillover: region and base URL."
  type = list(object({
    region = string
    url    = string
  }))
  default = []
}

variable "peer_ca_pem" {
  description = "The CA certificate (PEM) that https peer regions' frontends are checked against; empty when no peer uses https."
  type        = string
  default     = ""
}

variable "api_keys" {
  description = "API keys this region registers (the same list in every region of a fleet): id, project and the regions that may serve each (empty: any)."
  type = list(object({
    id      = string
    project = optional(string, "default")
    regions = optional(list(string), [])
  }))
  default = []
}

variable "api_key_secrets" {
  description = "The secret of each key of var.api_keys, by key id."
  type        = map(string)
  default     = {}
  sensitive   = true
}

variable "frontend_tls" {
  description = "TLS for the API's Ingress: the Secret holding its certificate, issued by cert-manager's cluster_issuer when one is named. Peer regions reached over https need it. Null: no TLS."
  type = object({
    secret         = string
    cluster_issuer = optional(string, "")
  })
  default = null
}

variable "hop_key" {
  description = "The key (at least 32 bytes) every region's frontends sign region hops with: the same in every region of a fleet. Needed with peer_regions."
  type        = string
  default     = ""
  sensitive   = true
}

variable "extra_values" {
  description = "More chart values, as YAML documents applied after this module's (TLS, discovery, monitoring, ...)."
  type        = list(string)
  default     = []
}
