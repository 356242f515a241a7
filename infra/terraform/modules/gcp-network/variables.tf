variable "name" {
  description = "Name of the VPC network."
  type        = string
}

variable "subnets" {
  description = "Region => subnet CIDR (one subnet per region of the run)."
  type        = map(string)
}

variable "metrics_port" {
  description = "Port scraped on actors and relays (instances tagged aurora-metrics); null: no firewall rule."
  type        = number
  default     = null
}

variable "metrics_cidrs" {
  description = "Source ranges allowed to scrape metrics_port."
  type        = list(string)
  default     = []
}
