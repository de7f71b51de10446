variable "regions" {
  description = "The fleet's regions by name: each one's public API URL, its worker pools (model placement) and, optionally, the other regions nearest first (default: the others by name)."
  type = map(object({
    url          = string
    worker_pools = optional(any, [])
    nearest      = optional(list(string), [])
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
