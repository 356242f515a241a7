variable "name" {
  description = "Replication group id (lowercase letters, digits and hyphens; at most 40 characters)."
  type        = string
}

variable "run" {
  description = "Run name (for descriptions and the SSM parameter path)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the replication group (the trainer's home region)."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets of the replication group (two zones for automatic failover)."
  type        = list(string)
}

variable "allowed_security_groups" {
  description = "Security groups (same VPC) whose members may connect on the Redis port: name => security group id."
  type        = map(string)
}

variable "allowed_cidrs" {
  description = "CIDRs (peered VPCs of remote regions) that may connect on the Redis port."
  type        = list(string)
  default     = []
}

variable "engine" {
  description = "\"valkey\" or \"redis\"."
  type        = string
  default     = "valkey"
}

variable "engine_version" {
  description = "Engine version: the users' write-only and read-only key selectors (%W~, %R~) need Redis >= 7 or Valkey (7.2, 8.x)."
  type        = string
  default     = "8.0"
  validation {
    condition     = can(regex("^[0-9]+", var.engine_version)) && tonumber(regex("^[0-9]+", var.engine_version)) >= 7
    error_message = "engine_version must be 7 or later (Redis 7.x, Valkey 7.2/8.x): the per-role users need %R~/%W~ key selectors."
  }
}

variable "node_type" {
  description = "Cache node type."
  type        = string
  default     = "cache.t4g.small"
}

variable "num_cache_clusters" {
  description = "Nodes in the replication group (1 primary + replicas); >= 2 enables Multi-AZ automatic failover."
  type        = number
  default     = 2
}

variable "secret" {
  description = "The run's Redis secret: every user's password and the relays' cache token are derived from it (sha256)."
  type        = string
  sensitive   = true
}

variable "tags" {
  description = "Extra tags."
  type        = map(string)
  default     = {}
}
