# The default `aws` provider passed in is the remote region's; `aws.home` is the trainer's home region
# (for the home side of the VPC peering).

variable "region" {
  description = "The remote region."
  type        = string
}

variable "cidr" {
  description = "VPC CIDR of this region (must not overlap the home VPC)."
  type        = string
}

variable "availability_zones" {
  description = "Zones for the subnets; empty: the first two available."
  type        = list(string)
  default     = []
}

variable "bucket_name" {
  description = "Name of this region's bucket."
  type        = string
}

variable "actor_count" {
  description = "Actors in this region."
  type        = number
}

variable "common" {
  description = "Settings shared by every region of the run (built by the root module)."
  type = object({
    name                    = string
    run                     = string
    home_region             = string
    tags                    = map(string)
    gc_role_arns            = list(string)
    versioning              = bool
    noncurrent_version_days = number
    force_destroy           = bool
    source_bucket_arn       = string
    source_bucket_url       = string
    actor_redis_parameter   = string
    actor_redis_arn         = string
    relay_redis_parameter   = string
    relay_redis_arn         = string
    cache_token_parameter   = string
    cache_token_arn         = string
    admission_secret_id     = string
    admission_secret_arn    = string
    home_vpc_id             = string
    home_route_table_id     = string
    home_cidr               = string
    actor_instance_types    = list(string)
    actor_image             = string
    actor_root_device_name  = string
    actor_root_volume_gb    = number
    actor_stop_timeout_s    = number
    engine                  = string
    relay_instance_type     = string
    relay_image             = string
    relay_root_device_name  = string
    pip_requirements        = string
    pip_extra_args          = string
    trainer_public_key      = string
    metrics_port            = number
    metrics_cidrs           = list(string)
    model_url               = string
  })
}
