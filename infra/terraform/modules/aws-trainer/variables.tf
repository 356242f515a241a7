variable "name" {
  description = "Name prefix (aurora-<run>)."
  type        = string
}

variable "run" {
  type = string
}

variable "region" {
  description = "The home region (the trainer's bucket, Redis and this instance)."
  type        = string
}

variable "subnet_id" {
  description = "Home-region subnet to launch the trainer in."
  type        = string
}

variable "availability_zone" {
  description = "The subnet's zone: the checkpoint volume lives there and outlives any one instance."
  type        = string
}

variable "security_group_id" {
  description = "The trainer's security group (on the Redis allow-list)."
  type        = string
}

variable "instance_profile_name" {
  description = "The trainer's instance profile (writes the home bucket, reads the Redis URL and signing key)."
  type        = string
}

variable "instance_type" {
  description = "On-demand GPU instance type."
  type        = string
}

variable "gpus" {
  description = "GPUs of instance_type: torchrun --nproc-per-node (one rank per GPU)."
  type        = number
}

variable "image" {
  description = "AMI id or resolve:ssm:<public parameter> (with NVIDIA drivers)."
  type        = string
}

variable "root_device_name" {
  type = string
}

variable "root_volume_gb" {
  type = number
}

variable "data_volume_gb" {
  description = "Checkpoint volume (master weights, optimizer state, published rows, model cache)."
  type        = number
}

variable "data_volume_final_snapshot" {
  description = "Snapshot the checkpoint volume when Terraform deletes it."
  type        = bool
}

variable "secret_recovery_days" {
  description = "Secrets Manager recovery window of the signing-key secret (0: delete at once on destroy)."
  type        = number
}

variable "bucket_url" {
  type = string
}

variable "redis_parameter_name" {
  type = string
}

variable "admission_secret_id" {
  description = "Secrets Manager secret (this region) holding the run's admission secret."
  type        = string
}

variable "redis_parameter_region" {
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
  description = "Who may scrape the metrics port: networks inside the run (the home VPC)."
  type        = list(string)
}

variable "trainer_args" {
  description = "Further `python -m workers.trainer` flags, e.g. [\"--steps\", \"2000\", \"--model\", \"/var/lib/aurora-trainer/model\"]."
  type        = list(string)
}

variable "stop_timeout_s" {
  description = "Seconds between SIGTERM (rank 0 finishes its step, saves, tells the others) and SIGKILL."
  type        = number
}

variable "tags" {
  type = map(string)
}
