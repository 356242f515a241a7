variable "name" {
  description = "Name prefix (e.g. aurora-<run>)."
  type        = string
}

variable "run" {
  description = "Run name (--run)."
  type        = string
}

variable "region" {
  description = "Region of these actors (--region)."
  type        = string
}

variable "bucket_name" {
  description = "The region's bucket (read-only for actors)."
  type        = string
}

variable "bucket_url" {
  description = "URL of the region's bucket (--bucket)."
  type        = string
}

variable "source_bucket_name" {
  description = "The trainer's home bucket (read-only: fallback when the region's relay is gone)."
  type        = string
}

variable "source_bucket_url" {
  description = "URL of the home bucket (--source-bucket, passed when it differs from bucket_url)."
  type        = string
}

variable "admission_secret_id" {
  description = "Secret Manager secret holding the run's admission secret (projects/<p>/secrets/<id>)."
  type        = string
}

variable "redis_secret_id" {
  description = "Secret Manager secret holding the Redis URL (projects/<p>/secrets/<id>)."
  type        = string
}

variable "redis_ca_cert" {
  description = "PEM of the Memorystore server CA."
  type        = string
}

variable "redis_ca_path" {
  description = "Where the CA is written on the instance (the URL in the secret points there)."
  type        = string
}

variable "subnetwork_id" {
  type = string
}

variable "desired_count" {
  description = "Actors in this region."
  type        = number
}

variable "machine_type" {
  description = "Machine type (e.g. g2-standard-8, which comes with one L4 GPU)."
  type        = string
}

variable "gpu_type" {
  description = "Accelerator to attach for machine types without built-in GPUs (e.g. nvidia-tesla-t4 on n1-*); empty: none."
  type        = string
  default     = ""
}

variable "gpu_count" {
  type    = number
  default = 0
}

variable "image" {
  description = "Boot image (project/family or self link)."
  type        = string
}

variable "disk_gb" {
  type    = number
  default = 200
}

variable "pip_requirements" {
  description = "Shell-quoted requirement specifiers for `pip install`."
  type        = string
}

variable "pip_extra_args" {
  type    = string
  default = ""
}

variable "engine" {
  description = "--engine (torch or vllm); empty: the actor's default."
  type        = string
  default     = ""
}

variable "trainer_public_key" {
  description = "--trainer-public-key (base64); empty: not passed."
  type        = string
  default     = ""
}

variable "metrics_port" {
  description = "--metrics-port; null: off."
  type        = number
  default     = null
}

variable "model_url" {
  description = "Exported to the service as AURORA_MODEL_URL."
  type        = string
  default     = ""
}

variable "stop_timeout_s" {
  description = "TimeoutStopSec (GCE gives spot VMs ~30 s after the preemption notice; a normal stop waits this long)."
  type        = number
  default     = 90
}

variable "labels" {
  type    = map(string)
  default = {}
}
