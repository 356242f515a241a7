variable "name" {
  description = "Name prefix for the network's resources."
  type        = string
}

variable "region" {
  description = "Region of the network (the provider passed to this module must be configured for it)."
  type        = string
}

variable "cidr" {
  description = "VPC CIDR (distinct per region: remote VPCs are peered with the home VPC)."
  type        = string
}

variable "availability_zones" {
  description = "Availability zones for the subnets; empty: the first two available zones of the region."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Extra tags."
  type        = map(string)
  default     = {}
}
