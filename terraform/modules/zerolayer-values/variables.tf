variable "region" {
  description = "The region the installation serves."
  type        = string
}

variable "release_name" {
  description = "The Helm release name (the chart names its objects after it)."
  type        = string
  default     = "zl"
}

variable "namespace" {
  description = "The namespace the release is installed into."
  type        = string
  default     = "zerolayer"
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
  description = "Orchestrators in the region's Raft group: 3 or 5 (1 only for a toy install). Change it only through this value: the chart's pre-upgrade hook removes members before a scale-down."
  type        = number
  default     = 3

  validation {
    condition     = contains([1, 3, 5], var.orchestrator_replicas)
    error_message = "Use 1, 3 or 5 orchestrators."
  }
}

variable "worker_pools" {
  description = "The region's worker pools, as the chart's workers.pools (unset attributes take the chart's defaults)."
  type = list(object({
    name         = string
    deviceClass  = optional(string, "cpu")
    device       = optional(string, "cpu")
    replicas     = optional(number, 2)
    kvMemoryMb   = optional(number, 512)
    maxRunning   = optional(number, 32)
    models       = optional(list(string), [])
    modelVolume  = optional(map(map(string)), {})
    resources    = optional(map(map(string)), { requests = { cpu = "2", memory = "2Gi" }, limits = { memory = "4Gi" } })
    nodeSelector = optional(map(string), {})
    tolerations  = optional(list(map(string)), [])
    image        = optional(map(string), {})
    rollout      = optional(map(number), { maxSurge = 1, maxUnavailable = 0 })
    autoscaling = optional(object({
      enabled                        = optional(bool, false)
      minReplicas                    = optional(number, 1)
      maxReplicas                    = optional(number, 8)
      targetCPUUtilizationPercentage = optional(number, 80)
      targetQueueDepth               = optional(number, 4)
    }), {})
    extraArgs = optional(list(string), [])
  }))
  default = []
}

variable "frontend_replicas" {
  description = "Frontend replicas in the region."
  type        = number
  default     = 2
}

variable "frontend_host" {
  description = "The host name of the region's API; with ingress_class it gets an Ingress. Empty: no Ingress."
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

variable "frontend_tls" {
  description = "TLS for the API's Ingress: the Secret holding its certificate, issued by cert-manager's cluster_issuer when one is named (https peer URLs need it). Null: no TLS."
  type = object({
    secret         = string
    cluster_issuer = optional(string, "")
  })
  default = null
}

variable "peer_regions" {
  description = "Peer regions' frontends, nearest first, for spillover: region and base URL."
  type = list(object({
    region = string
    url    = string
  }))
  default = []
}

variable "peer_ca_secret" {
  description = "The Secret (key ca.pem) with the CA https peer regions' certificates chain to; empty: none."
  type        = string
  default     = ""
}

variable "hop_key_secret" {
  description = "The Secret (key `key`) whose key every region's frontends sign hops with; needed with peer regions."
  type        = string
  default     = ""
}

variable "api_keys" {
  description = "API keys the region registers: id, project and the regions that may serve each (empty: any)."
  type = list(object({
    id      = string
    project = optional(string, "default")
    regions = optional(list(string), [])
  }))
  default = []
}

variable "keys_secret" {
  description = "The Secret holding each API key's secret under its id."
  type        = string
  default     = ""
}
