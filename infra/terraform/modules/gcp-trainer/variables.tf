variable "name" {
  description = "Name prefix (aurora-<run>)."
  type        = string
}

variable "run" {
  type = string
}

variable "region" {
  description = "The home region."
  type        = string
}

variable "zone" {
  description = "Zone of the VM and its checkpoint disk (a zone of region with the GPU type)."
  type        = string
}

variable "network_id" {
  type = string
}

variable "subnetwork_id" {
  type = string
}

variable "service_account_email" {
  description = "The trainer's service account (writes the home bucket, reads the Redis URL)."
  type        = string
}

variable "service_account_member" {
  type = string
}

variable "machine_type" {
  description = "On-demand machine type (e.g. a2-highgpu-4g, g2-standard-48: GPUs built in)."
  type        = string
}

variable "gpu_type" {
  description = "Accelerator for machine types without built-in GPUs; empty: none attached explicitly."
  type        = string
}

variable "gpu_count" {
  description = "Accelerators to attach (with gpu_type)."
  type        = number
}

variable "gpus" {
  description = "GPUs the VM has: torchrun --nproc-per-node (one rank per GPU)."
  type        = number
}

variable "image" {
  type = string
}

variable "boot_disk_gb" {
  type = number
}

variable "data_disk_gb" {
  description = "Checkpoint disk (master weights, optimizer state, published rows, model cache)."
  type        = number
}

variable "bucket_url" {
  type = string
}

variable "admission_secret_id" {
  description = "Secret Manager secret holding the run's admission secret (projects/<p>/secrets/<id>)."
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

variable "pip_requirements" {
  type = string
}

variable "pip_extra_args" {
  type = string
}

variable "model_url" {
  type = string
}

variable "metrics_port" {
  type = number
}

variable "metrics_cidrs" {
  description = "Who may scrape the metrics port: the run's subnets."
  type        = list(string)
}

variable "trainer_args" {
  type = list(string)
}

variable "stop_timeout_s" {
  type = number
}

variable "labels" {
  type = map(string)
}
