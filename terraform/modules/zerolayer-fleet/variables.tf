variable "regions" {
  description = "The fleet's regions by name: each one's public API URL, its worker pools (model placement) and, optionally, the other regions nearest first (default: the others by name)."
  type = map(object({
    url = string
    # The chart's workers.pools, typed (the same type as modules/zerolayer-values): regions whose pools differ
    # still make one map.
    worker_pools = optional(list(object({
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
    })), [])
    nearest = optional(list(string), [])
  }))

  validation {
    condition     = alltrue([for name, r in var.regions : can(regex("^[a-z0-9][a-z0-9._-]{0,63}$", name))])
    error_message = "Region names are 1 to 64 of a-z, 0-9, '-', '_' and '.', starting with a letter or digit."
  }

  validation {
    condition     = alltrue([for name, r in var.regions : alltrue([for n in r.nearest : contains(keys(var.regions), n) && n != name])])
    error_message = "Every region named in a `nearest` list must be another region of the fleet."
  }
}

variable "api_keys" {
  description = "API keys for every region: id, project and the regions that may serve each (data residency; empty: any region)."
  type = list(object({
    id      = string
    project = optional(string, "default")
    regions = optional(list(string), [])
  }))
  default = []
}

variable "spillover" {
  description = "Whether regions spill requests they cannot serve to their peers (false: every region stands alone)."
  type        = bool
  default     = true
}
