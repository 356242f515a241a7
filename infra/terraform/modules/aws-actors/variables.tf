variable "name" {
  description = "Name prefix (e.g. aurora-<run>)."
  type        = string
}

variable "run" {
  description = "Run name (--run)."
  type        = string
}

variable "region" {
  description = "Region of these actors (--region; the provider passed to this module must be configured for it)."
  type        = string
}

variable "bucket_arn" {
  description = "ARN of the region's bucket (read-only for actors)."
  type        = string
}

variable "bucket_url" {
  description = "URL of the region's bucket (--bucket)."
  type        = string
}

variable "source_bucket_arn" {
  description = "ARN of the trainer's home bucket (read-only: fallback when the region's relay is gone)."
  type        = string
}

variable "source_bucket_url" {
  description = "URL of the trainer's home bucket (--source-bucket, passed when it differs from bucket_url)."
  type        = string
}

variable "redis_parameter_name" {
  description = "SSM parameter (SecureString) holding the actor user's Redis URL."
  type        = string
}

variable "redis_parameter_arn" {
  description = "ARN of that parameter (with the cache token's, the only SSM permissions actors get)."
  type        = string
}

variable "admission_secret_id" {
  description = "Secrets Manager secret (home region) holding the run's admission secret."
  type        = string
}

variable "admission_secret_arn" {
  description = "ARN of that secret (actors may read it and nothing else of Secrets Manager)."
  type        = string
}

variable "cache_token_parameter" {
  description = "SSM parameter (SecureString, home region) holding the relays' cache token."
  type        = string
}

variable "cache_token_arn" {
  description = "ARN of that parameter."
  type        = string
}

variable "redis_parameter_region" {
  description = "Region of that parameter (the home region)."
  type        = string
}

variable "vpc_id" {
  type = string
}

variable "subnet_ids" {
  type = list(string)
}

variable "desired_count" {
  description = "Actors in this region."
  type        = number
}

variable "instance_types" {
  description = "Spot instance types, in order of preference (the first is the launch template's default)."
  type        = list(string)
}

variable "image" {
  description = "AMI id, or resolve:ssm:<public parameter> (resolved per region at launch)."
  type        = string
}

variable "root_device_name" {
  description = "Root device of the image (/dev/sda1 on Ubuntu-based images, /dev/xvda on Amazon Linux)."
  type        = string
  default     = "/dev/sda1"
}

variable "root_volume_gb" {
  description = "Root volume size (holds the venv, the model snapshot cache and vLLM's files)."
  type        = number
  default     = 200
}

variable "pip_requirements" {
  description = "Shell-quoted requirement specifiers for `pip install` (the aurora package and extras)."
  type        = string
}

variable "pip_extra_args" {
  description = "Extra `pip install` arguments (e.g. --extra-index-url ...)."
  type        = string
  default     = ""
}

variable "engine" {
  description = "--engine (torch or vllm); empty: the actor's default (vllm when installed)."
  type        = string
  default     = ""
}

variable "trainer_public_key" {
  description = "--trainer-public-key (base64 Ed25519 public key); empty: not passed."
  type        = string
  default     = ""
}

variable "metrics_port" {
  description = "--metrics-port; null: no metrics endpoint."
  type        = number
  default     = null
}

variable "metrics_cidrs" {
  description = "CIDRs allowed to scrape metrics_port."
  type        = list(string)
  default     = []
}

variable "model_url" {
  description = "Base model URL, exported to the service as AURORA_MODEL_URL."
  type        = string
  default     = ""
}

variable "stop_timeout_s" {
  description = "TimeoutStopSec: grace between SIGTERM and SIGKILL (spot gives ~120 s notice; keep it below that)."
  type        = number
  default     = 90
}

variable "tags" {
  type    = map(string)
  default = {}
}
