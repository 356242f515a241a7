# Aurora on GCP: per-region buckets, Memorystore (control plane) in the trainer's home region, Spot actors
# in every region, one relay per remote region, and one service account per role and region.

locals {
  name           = "aurora-${var.run}"
  regions        = concat([var.home_region], var.remote_regions)
  remote_regions = toset(var.remote_regions)
  labels         = merge(var.labels, { aurora-run = var.run, managed-by = "terraform" })

  subnets          = { for i, region in local.regions : region => cidrsubnet(var.subnet_cidr_base, 8, i) }
  actor_counts     = { for region in local.regions : region => lookup(var.actor_count_by_region, region, var.actor_count) }
  pip_requirements = join(" ", [for spec in concat([var.package_spec], var.extra_pip_packages) : "'${spec}'"])
  home_bucket      = module.bucket[var.home_region]
}

resource "google_project_service" "apis" {
  for_each           = var.enable_apis ? toset(["compute.googleapis.com", "redis.googleapis.com", "secretmanager.googleapis.com", "storage.googleapis.com", "iam.googleapis.com"]) : toset([])
  service            = each.value
  disable_on_destroy = false
}

module "network" {
  source        = "../modules/gcp-network"
  name          = local.name
  subnets       = local.subnets
  metrics_port  = var.metrics_port
  metrics_cidrs = var.metrics_cidrs
  depends_on    = [google_project_service.apis]
}

module "bucket" {
  source                  = "../modules/gcp-bucket"
  for_each                = toset(local.regions)
  name                    = "${var.bucket_prefix}-${var.run}-${each.value}"
  region                  = each.value
  run                     = var.run
  kms_key_name            = var.kms_key_name
  noncurrent_version_days = var.noncurrent_version_days
  force_destroy           = var.force_destroy_buckets
  labels                  = local.labels
  depends_on              = [google_project_service.apis]
}

module "redis" {
  source         = "../modules/gcp-redis"
  name           = local.name
  run            = var.run
  region         = var.home_region
  network_id     = module.network.network_id
  tier           = var.redis_tier
  memory_size_gb = var.redis_memory_size_gb
  redis_version  = var.redis_version
  labels         = local.labels
  depends_on     = [google_project_service.apis]
}

module "actors" {
  source              = "../modules/gcp-actors"
  for_each            = toset(local.regions)
  name                = local.name
  run                 = var.run
  region              = each.value
  bucket_name         = module.bucket[each.value].name
  bucket_url          = module.bucket[each.value].url
  source_bucket_name  = local.home_bucket.name
  source_bucket_url   = local.home_bucket.url
  redis_secret_id     = module.redis.secret_id
  admission_secret_id = google_secret_manager_secret.admission.id
  redis_ca_cert       = module.redis.ca_cert
  redis_ca_path       = module.redis.ca_path
  subnetwork_id       = module.network.subnetwork_ids[each.value]
  desired_count       = local.actor_counts[each.value]
  machine_type        = var.actor_machine_type
  gpu_type            = var.actor_gpu_type
  gpu_count           = var.actor_gpu_count
  image               = var.actor_image
  disk_gb             = var.actor_disk_gb
  stop_timeout_s      = var.actor_stop_timeout_s
  engine              = var.engine
  pip_requirements    = local.pip_requirements
  pip_extra_args      = var.pip_extra_args
  trainer_public_key  = var.trainer_public_key
  metrics_port        = var.metrics_port
  model_url           = var.model_url
  labels              = local.labels
}

module "trainer" {
  source                 = "../modules/gcp-trainer"
  name                   = local.name
  run                    = var.run
  region                 = var.home_region
  zone                   = var.trainer_zone != "" ? var.trainer_zone : "${var.home_region}-a"
  network_id             = module.network.network_id
  subnetwork_id          = module.network.subnetwork_ids[var.home_region]
  service_account_email  = google_service_account.trainer.email
  service_account_member = google_service_account.trainer.member
  machine_type           = var.trainer_machine_type
  gpu_type               = var.trainer_gpu_type
  gpu_count              = var.trainer_gpu_count
  gpus                   = var.trainer_gpus
  image                  = var.trainer_image
  boot_disk_gb           = var.trainer_boot_disk_gb
  data_disk_gb           = var.trainer_data_disk_gb
  bucket_url             = local.home_bucket.url
  redis_secret_id        = module.redis.secret_id
  admission_secret_id    = google_secret_manager_secret.admission.id
  redis_ca_cert          = module.redis.ca_cert
  redis_ca_path          = module.redis.ca_path
  pip_requirements       = local.pip_requirements
  pip_extra_args         = var.pip_extra_args
  model_url              = var.model_url
  metrics_port           = var.metrics_port
  metrics_cidrs          = [for region in local.regions : local.subnets[region]] # the run's VPC only
  trainer_args           = var.trainer_args
  stop_timeout_s         = var.trainer_stop_timeout_s
  labels                 = local.labels
}

module "relay" {
  source                      = "../modules/gcp-relay"
  for_each                    = local.remote_regions
  name                        = local.name
  run                         = var.run
  region                      = each.value
  bucket_name                 = module.bucket[each.value].name
  bucket_url                  = module.bucket[each.value].url
  bucket_rewritable_condition = module.bucket[each.value].rewritable_objects_condition
  source_bucket_name          = local.home_bucket.name
  source_bucket_url           = local.home_bucket.url
  redis_secret_id             = module.redis.secret_id
  redis_ca_cert               = module.redis.ca_cert
  redis_ca_path               = module.redis.ca_path
  subnetwork_id               = module.network.subnetwork_ids[each.value]
  network_id                  = module.network.network_id
  subnet_cidr                 = local.subnets[each.value]
  machine_type                = var.relay_machine_type
  image                       = var.relay_image
  pip_requirements            = local.pip_requirements
  pip_extra_args              = var.pip_extra_args
  trainer_public_key          = var.trainer_public_key
  metrics_port                = var.metrics_port
  model_url                   = var.model_url
  labels                      = local.labels
}

# --- the admission secret: a secret without a version (the value never passes through Terraform or its state) --
# Actors prove their registration with it and the trainer checks it (AURORA_ADMISSION_SECRET): whoever holds
# only the Redis URL cannot join the run. The operator adds a version after apply (32 random bytes, e.g.
# `python -c 'import secrets; print(secrets.token_urlsafe(32))'`); VMs read it at boot, never from metadata.

resource "google_secret_manager_secret" "admission" {
  secret_id = "${local.name}-admission-secret"
  labels    = local.labels
  replication {
    auto {}
  }
}
