variable "name" {
  description = "Name prefix (e.g. aurora-<run>)."
  type        = string
}

variable "run" {
  description = "Run name (--run)."
  type        = string
}

variable "region" {
  description = "Region this relay serves (--region)."
  type        = string
}

variable "bucket_name" {
  description = "The region's bucket (the relay writes it)."
  type        = string
}

variable "bucket_url" {
  description = "URL of the region's bucket (--dest)."
  type        = string
}

variable "bucket_rewritable_condition" {
  description = "IAM condition of the objects the relay may overwrite in the regional bucket (gcp-bucket output)."
  type        = string
}

variable "source_bucket_name" {
  description = "The trainer's home bucket (the relay reads it)."
  type        = string
}

variable "source_bucket_url" {
  description = "URL of the home bucket (--source)."
  type        = string
}

variable "redis_secret_id" {
  type = string
}

variable "redis_ca_cert" {
  type = string
}

variable "redis_ca_path" {
  type = string
}

variable "subnetwork_id" {
  type = string
}

variable "machine_type" {
  description = "On-demand machine type of the relay (small; network bandwidth scales with vCPUs)."
  type        = string
}

variable "image" {
  type = string
}

variable "disk_gb" {
  type    = number
  default = 100
}

variable "pip_requirements" {
  type = string
}

variable "pip_extra_args" {
  type    = string
  default = ""
}

variable "trainer_public_key" {
  type    = string
  default = ""
}

variable "metrics_port" {
  type    = number
  default = null
}

variable "model_url" {
  type    = string
  default = ""
}

variable "stop_timeout_s" {
  type    = number
  default = 60
}

variable "labels" {
  type    = map(string)
  default = {}
}

variable "network_id" {
  description = "The run's VPC network (for the segment cache's firewall rule)."
  type        = string
}

variable "subnet_cidr" {
  description = "CIDR of this region's subnet: the only source allowed to reach the segment cache."
  type        = string
}

variable "cache_port" {
  description = "--cache-port: the relay's segment cache for the region's actors."
  type        = number
  default     = 8470
}
