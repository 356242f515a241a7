# --- the run and its regions ------------------------------------------------------------------------------

variable "run" {
  description = "Run name: the prefix of every object in the buckets (--run) and part of every resource name."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,19}$", var.run))
    error_message = "run: 1-20 lowercase letters, digits and hyphens, starting with a letter or digit."
  }
}

variable "home_region" {
  description = "The trainer's region: its bucket is the source every relay copies from, and the control plane (Redis) lives here."
  type        = string
}

variable "remote_regions" {
  description = "Other regions with actors, each fed by its own relay and bucket (at most 3: one provider slot each)."
  type        = list(string)
  default     = []
  validation {
    condition     = length(var.remote_regions) <= 3 && length(distinct(var.remote_regions)) == length(var.remote_regions)
    error_message = "remote_regions: at most 3 distinct regions (add a provider slot in providers.tf/main.tf for more)."
  }
}

variable "bucket_prefix" {
  description = "Bucket names are <bucket_prefix>-<run>-<region> (S3 names are global: pick something unique to you)."
  type        = string
  default     = "aurora"
}

variable "availability_zones" {
  description = "Optional zones per region (region => two or more zone names); regions not listed use their first two available zones."
  type        = map(list(string))
  default     = {}
}

variable "vpc_cidr_base" {
  description = "Each region's VPC gets a /16 of this range, in the order home, remote_regions..."
  type        = string
  default     = "10.64.0.0/10"
}

# --- software ----------------------------------------------------------------------------------------------

variable "package_spec" {
  description = "pip requirement for the aurora package, e.g. \"aurora-rl[rl] @ https://example.com/aurora_rl-0.1.0-py3-none-any.whl\"."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_.,\\[\\]-]+ *(==|@) *[^ ']+$", var.package_spec))
    error_message = "package_spec must pin one version (aurora-rl[rl]==0.1.0, or name @ a wheel URL) and contain no single quote: every machine of a run must run the same code."
  }
}

variable "extra_pip_packages" {
  description = "More requirements installed next to the package (e.g. [\"vllm==0.10.1\"] for --engine vllm)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for p in var.extra_pip_packages : !can(regex("'", p))])
    error_message = "extra_pip_packages must not contain single quotes."
  }
}

variable "pip_extra_args" {
  description = "Extra arguments for pip install (e.g. \"--extra-index-url https://download.pytorch.org/whl/cu124\")."
  type        = string
  default     = ""
}

variable "model_url" {
  description = "Base model the run starts from (exported to actors, relays and the trainer as AURORA_MODEL_URL)."
  type        = string
  default     = ""
}

variable "trainer_public_key" {
  description = "The trainer's Ed25519 public key (base64): actors and relays refuse manifests not signed with it. Empty: not checked."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^[A-Za-z0-9+/=]*$", var.trainer_public_key))
    error_message = "trainer_public_key must be base64."
  }
}

variable "engine" {
  description = "Actor inference engine (--engine): \"torch\", \"vllm\", or \"\" for the actor's default (vllm when installed)."
  type        = string
  default     = ""
  validation {
    condition     = contains(["", "torch", "vllm"], var.engine)
    error_message = "engine must be \"\", \"torch\" or \"vllm\"."
  }
}

variable "metrics_port" {
  description = "Serve Prometheus metrics on this port on actors and relays (--metrics-port); null: off."
  type        = number
  default     = null
}

variable "metrics_cidrs" {
  description = "CIDRs allowed to scrape metrics_port."
  type        = list(string)
  default     = []
}

# --- actors (spot) -----------------------------------------------------------------------------------------

variable "actor_count" {
  description = "Actors per region."
  type        = number
  default     = 2
}

variable "actor_count_by_region" {
  description = "Per-region overrides of actor_count (region => count)."
  type        = map(number)
  default     = {}
}

variable "actor_instance_types" {
  description = "Spot instance types for actors, most preferred first (more types: better spot availability)."
  type        = list(string)
  default     = ["g6.xlarge", "g5.xlarge", "g6e.xlarge"]
}

variable "actor_image" {
  description = "Actor AMI: an AMI id (single-region runs) or resolve:ssm:<public parameter>, resolved in each region."
  type        = string
  default     = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

variable "actor_root_device_name" {
  description = "Root device name of actor_image."
  type        = string
  default     = "/dev/sda1"
}

variable "actor_root_volume_gb" {
  description = "Actor root volume size (venv, model snapshot cache)."
  type        = number
  default     = 200
}

variable "actor_stop_timeout_s" {
  description = "Seconds between SIGTERM and SIGKILL when an actor is stopped (>= 60; below the 120 s spot notice)."
  type        = number
  default     = 90
  validation {
    condition     = var.actor_stop_timeout_s >= 60 && var.actor_stop_timeout_s <= 115
    error_message = "actor_stop_timeout_s must be between 60 and 115 seconds."
  }
}

# --- relays (on-demand, one per remote region) --------------------------------------------------------------

variable "relay_instance_type" {
  description = "Relay instance type (small, network-optimised, on-demand)."
  type        = string
  default     = "c6in.large"
}

variable "relay_image" {
  description = "Relay AMI id or resolve:ssm:<public parameter>."
  type        = string
  default     = "resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"
}

variable "relay_root_device_name" {
  description = "Root device name of relay_image."
  type        = string
  default     = "/dev/sda1"
}

# --- control plane (ElastiCache) ---------------------------------------------------------------------------

variable "redis_auth_token" {
  description = "The control plane's secret, 16-128 letters and digits (e.g. `openssl rand -hex 32`): the ElastiCache users' passwords (operator, trainer, relay, actor) and the relays' cache token are derived from it one-way."
  type        = string
  sensitive   = true
  validation {
    condition     = can(regex("^[A-Za-z0-9]{16,128}$", var.redis_auth_token))
    error_message = "redis_auth_token must be 16-128 letters and digits."
  }
}

variable "redis_engine" {
  description = "\"valkey\" or \"redis\"."
  type        = string
  default     = "valkey"
}

variable "redis_engine_version" {
  description = "Redis >= 7 or Valkey: the per-role users' %R~/%W~ key selectors need it."
  type        = string
  default     = "8.0"
}

variable "redis_node_type" {
  type    = string
  default = "cache.t4g.small"
}

variable "redis_num_cache_clusters" {
  description = "Nodes (primary + replicas); >= 2 enables Multi-AZ failover."
  type        = number
  default     = 2
}

variable "redis_allowed_cidrs" {
  description = "Extra CIDRs allowed to reach Redis (e.g. a VPN or bastion from which you run `aurora status`)."
  type        = list(string)
  default     = []
}

# --- buckets and garbage collection ----------------------------------------------------------------------------

variable "gc_principal_arns" {
  description = "IAM principals allowed to assume the GC role (the only identity that may delete version data, used by `aurora gc`). Empty: any principal of this account that IAM allows to assume it."
  type        = list(string)
  default     = []
}

variable "noncurrent_version_days" {
  description = "Days noncurrent object versions (overwritten pointers, objects deleted by `aurora gc`) are kept."
  type        = number
  default     = 7
}

variable "force_destroy_buckets" {
  description = "Let `terraform destroy` delete non-empty buckets."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}

# --- trainer (on-demand GPU instance in the home region) ------------------------------------------------------

variable "trainer_instance_type" {
  description = "On-demand GPU instance type of the trainer (never spot: it holds the run's optimizer state)."
  type        = string
  default     = "g6e.12xlarge"
}

variable "trainer_gpus" {
  description = "GPUs of trainer_instance_type: torchrun --nproc-per-node (one data-parallel rank per GPU)."
  type        = number
  default     = 4
  validation {
    condition     = var.trainer_gpus >= 1 && floor(var.trainer_gpus) == var.trainer_gpus
    error_message = "trainer_gpus must be a positive integer."
  }
}

variable "trainer_image" {
  description = "Trainer AMI id or resolve:ssm:<public parameter> (with NVIDIA drivers)."
  type        = string
  default     = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

variable "trainer_root_device_name" {
  description = "Root device name of trainer_image."
  type        = string
  default     = "/dev/sda1"
}

variable "trainer_root_volume_gb" {
  description = "Trainer root volume (venv, CUDA libraries)."
  type        = number
  default     = 200
}

variable "trainer_data_volume_gb" {
  description = "Checkpoint volume of the trainer (fp32 master weights + Adam state ≈ 16 bytes per parameter, plus the model cache)."
  type        = number
  default     = 500
}

variable "trainer_data_volume_final_snapshot" {
  description = "Snapshot the checkpoint volume when `terraform destroy` deletes it."
  type        = bool
  default     = true
}

variable "trainer_args" {
  description = "Further `python -m workers.trainer` flags (e.g. [\"--steps\", \"2000\", \"--model\", \"/var/lib/aurora-trainer/model\"]); plain words only."
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

variable "signing_key_recovery_days" {
  description = "Secrets Manager recovery window of the signing-key secret (0: deleted at once by destroy, so the run name can be reused)."
  type        = number
  default     = 7
}
