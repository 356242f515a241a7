# --- the run and its regions ------------------------------------------------------------------------------

variable "project_id" {
  description = "GCP project to deploy into."
  type        = string
}

variable "run" {
  description = "Run name: the prefix of every object in the buckets (--run) and part of every resource name."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.run))
    error_message = "run: 1-20 lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "home_region" {
  description = "The trainer's region: its bucket is the source every relay copies from, and Memorystore lives here."
  type        = string
}

variable "remote_regions" {
  description = "Other regions with actors, each fed by its own relay and bucket."
  type        = list(string)
  default     = []
  validation {
    condition     = length(distinct(var.remote_regions)) == length(var.remote_regions)
    error_message = "remote_regions must be distinct."
  }
}

variable "bucket_prefix" {
  description = "Bucket names are <bucket_prefix>-<run>-<region> (GCS names are global: pick something unique to you)."
  type        = string
  default     = "aurora"
}

variable "subnet_cidr_base" {
  description = "Each region's subnet gets a /20 of this range, in the order home, remote_regions..."
  type        = string
  default     = "10.128.0.0/12"
}

# --- software ----------------------------------------------------------------------------------------------

variable "package_spec" {
  description = "pip requirement for the aurora package with the gcs extra, e.g. \"aurora-rl[rl,gcs] @ https://example.com/aurora_rl-0.1.0-py3-none-any.whl\"."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_.,\\[\\]-]+ *(==|@) *[^ ']+$", var.package_spec))
    error_message = "package_spec must pin one version (aurora-rl[rl]==0.1.0, or name @ a wheel URL) and contain no single quote: every machine of a run must run the same code."
  }
}

variable "extra_pip_packages" {
  description = "More requirements installed next to the package (e.g. [\"vllm==0.10.1\"])."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for p in var.extra_pip_packages : !can(regex("'", p))])
    error_message = "extra_pip_packages must not contain single quotes."
  }
}

variable "pip_extra_args" {
  description = "Extra arguments for pip install."
  type        = string
  default     = ""
}

variable "model_url" {
  description = "Base model the run starts from (exported as AURORA_MODEL_URL)."
  type        = string
  default     = ""
}

variable "trainer_public_key" {
  description = "The trainer's Ed25519 public key (base64); empty: not checked."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^[A-Za-z0-9+/=]*$", var.trainer_public_key))
    error_message = "trainer_public_key must be base64."
  }
}

variable "engine" {
  description = "Actor inference engine (--engine): \"torch\", \"vllm\", or \"\" for the default."
  type        = string
  default     = ""
  validation {
    condition     = contains(["", "torch", "vllm"], var.engine)
    error_message = "engine must be \"\", \"torch\" or \"vllm\"."
  }
}

variable "metrics_port" {
  description = "Prometheus metrics port on actors and relays (--metrics-port); null: off."
  type        = number
  default     = null
}

variable "metrics_cidrs" {
  description = "Source ranges allowed to scrape metrics_port."
  type        = list(string)
  default     = []
}

# --- actors (Spot VMs) ---------------------------------------------------------------------------------------

variable "actor_count" {
  description = "Actors per region."
  type        = number
  default     = 2
}

variable "actor_count_by_region" {
  description = "Per-region overrides of actor_count."
  type        = map(number)
  default     = {}
}

variable "actor_machine_type" {
  description = "Actor machine type (g2-standard-8 has one NVIDIA L4)."
  type        = string
  default     = "g2-standard-8"
}

variable "actor_gpu_type" {
  description = "Accelerator for machine types without built-in GPUs (e.g. nvidia-tesla-t4 with n1-standard-8); empty: none."
  type        = string
  default     = ""
}

variable "actor_gpu_count" {
  type    = number
  default = 0
}

variable "actor_image" {
  description = "Actor boot image with NVIDIA drivers (list: gcloud compute images list --project ubuntu-os-accelerator-images)."
  type        = string
  default     = "ubuntu-os-accelerator-images/ubuntu-accelerator-2204-amd64-with-nvidia-550"
}

variable "actor_disk_gb" {
  type    = number
  default = 200
}

variable "actor_stop_timeout_s" {
  description = "Seconds between SIGTERM and SIGKILL when an actor is stopped (>= 60)."
  type        = number
  default     = 90
  validation {
    condition     = var.actor_stop_timeout_s >= 60
    error_message = "actor_stop_timeout_s must be at least 60 seconds."
  }
}

# --- relays -------------------------------------------------------------------------------------------------------

variable "relay_machine_type" {
  type    = string
  default = "n2-standard-4"
}

variable "relay_image" {
  type    = string
  default = "ubuntu-os-cloud/ubuntu-2404-lts-amd64"
}

# --- control plane (Memorystore) ----------------------------------------------------------------------------------

variable "redis_tier" {
  description = "BASIC or STANDARD_HA."
  type        = string
  default     = "STANDARD_HA"
}

variable "redis_memory_size_gb" {
  type    = number
  default = 1
}

variable "redis_version" {
  type    = string
  default = "REDIS_7_2"
}

# --- buckets and garbage collection ------------------------------------------------------------------------

variable "gc_members" {
  description = "Principals (e.g. user:ops@example.com) allowed to impersonate the GC service account, the only identity that may delete version data (`aurora gc`)."
  type        = list(string)
  default     = []
}

variable "kms_key_name" {
  description = "Customer-managed encryption key for the buckets; null: Google-managed encryption."
  type        = string
  default     = null
}

variable "noncurrent_version_days" {
  type    = number
  default = 7
}

variable "force_destroy_buckets" {
  type    = bool
  default = false
}

variable "enable_apis" {
  description = "Enable the APIs the run needs (compute, redis, secretmanager, storage, iam)."
  type        = bool
  default     = true
}

variable "labels" {
  type    = map(string)
  default = {}
}

# --- trainer (on-demand GPU VM in the home region) ------------------------------------------------------------

variable "trainer_zone" {
  description = "Zone of the trainer VM and its checkpoint disk (one with the GPU type); empty: <home_region>-a."
  type        = string
  default     = ""
}

variable "trainer_machine_type" {
  description = "On-demand machine type of the trainer (never Spot: it holds the run's optimizer state)."
  type        = string
  default     = "a2-highgpu-4g" # four NVIDIA A100 40GB, built in
}

variable "trainer_gpu_type" {
  description = "Accelerator to attach for machine types without built-in GPUs (e.g. nvidia-tesla-t4 with n1-standard-16); empty: none."
  type        = string
  default     = ""
}

variable "trainer_gpu_count" {
  type    = number
  default = 0
}

variable "trainer_gpus" {
  description = "GPUs the trainer VM has: torchrun --nproc-per-node (one data-parallel rank per GPU)."
  type        = number
  default     = 4
  validation {
    condition     = var.trainer_gpus >= 1 && floor(var.trainer_gpus) == var.trainer_gpus
    error_message = "trainer_gpus must be a positive integer."
  }
}

variable "trainer_image" {
  description = "Trainer boot image with NVIDIA drivers."
  type        = string
  default     = "ubuntu-os-accelerator-images/ubuntu-accelerator-2204-amd64-with-nvidia-550"
}

variable "trainer_boot_disk_gb" {
  type    = number
  default = 200
}

variable "trainer_data_disk_gb" {
  description = "Checkpoint disk of the trainer (fp32 master weights + Adam state ≈ 16 bytes per parameter, plus the model cache)."
  type        = number
  default     = 500
}

variable "trainer_args" {
  description = "Further `python -m workers.trainer` flags (e.g. [\"--steps\", \"2000\"]); plain words only."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for a in var.trainer_args : can(regex("^[A-Za-z0-9_./:=,+@-]+$", a))])
    error_message = "trainer_args must be plain words (no spaces, quotes, $ or %: they go into a systemd ExecStart line)."
  }
}

variable "trainer_stop_timeout_s" {
  description = "Seconds between SIGTERM (rank 0 finishes its step and checkpoints) and SIGKILL."
  type        = number
  default     = 600
  validation {
    condition     = var.trainer_stop_timeout_s >= 60
    error_message = "trainer_stop_timeout_s must be at least 60 seconds."
  }
}
