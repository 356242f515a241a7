variable "name" {
  description = "Instance name."
  type        = string
}

variable "run" {
  type = string
}

variable "region" {
  description = "The trainer's home region."
  type        = string
}

variable "network_id" {
  description = "The run's VPC: the only network the instance is reachable from."
  type        = string
}

variable "tier" {
  description = "BASIC or STANDARD_HA."
  type        = string
  default     = "STANDARD_HA"
}

variable "memory_size_gb" {
  type    = number
  default = 1
}

variable "redis_version" {
  description = "Streams need >= 5."
  type        = string
  default     = "REDIS_7_2"
}

variable "labels" {
  type    = map(string)
  default = {}
}
