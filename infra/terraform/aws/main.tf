# Aurora on AWS: per-region buckets, an ElastiCache control plane in the trainer's home region, spot
# actors in every region, one relay per remote region, and least-privilege roles for each of them.
#
#   home region:   VPC, bucket (the source), Redis, actors, the trainer (GPU instance, checkpoint volume,
#                  signing-key secret, role, security group), GC role
#   remote slot i: VPC (peered with home), bucket, actors, relay (home bucket -> regional bucket)

locals {
  name    = "aurora-${var.run}"
  regions = concat([var.home_region], var.remote_regions)
  tags    = merge(var.tags, { "aurora:run" = var.run, "managed-by" = "terraform" })

  remote_slots = [for i in range(3) : try(var.remote_regions[i], var.home_region)]
  cidrs        = { for i, region in local.regions : region => cidrsubnet(var.vpc_cidr_base, 6, i) }
  bucket_names = { for region in local.regions : region => "${var.bucket_prefix}-${var.run}-${region}" }
  actor_counts = { for region in local.regions : region => lookup(var.actor_count_by_region, region, var.actor_count) }

  pip_requirements = join(" ", [for spec in concat([var.package_spec], var.extra_pip_packages) : "'${spec}'"])

  # Settings every remote region shares.
  common = {
    name                    = local.name
    run                     = var.run
    home_region             = var.home_region
    tags                    = local.tags
    gc_role_arns            = [aws_iam_role.gc.arn]
    versioning              = true
    noncurrent_version_days = var.noncurrent_version_days
    force_destroy           = var.force_destroy_buckets
    source_bucket_arn       = module.home_bucket.arn
    source_bucket_url       = module.home_bucket.url
    actor_redis_parameter   = module.redis.url_parameter_names["actor"]
    actor_redis_arn         = module.redis.url_parameter_arns["actor"]
    relay_redis_parameter   = module.redis.url_parameter_names["relay"]
    relay_redis_arn         = module.redis.url_parameter_arns["relay"]
    cache_token_parameter   = module.redis.cache_token_parameter_name
    cache_token_arn         = module.redis.cache_token_parameter_arn
    admission_secret_id     = aws_secretsmanager_secret.admission.name
    admission_secret_arn    = aws_secretsmanager_secret.admission.arn
    home_vpc_id             = module.home_network.vpc_id
    home_route_table_id     = module.home_network.route_table_id
    home_cidr               = module.home_network.cidr
    actor_instance_types    = var.actor_instance_types
    actor_image             = var.actor_image
    actor_root_device_name  = var.actor_root_device_name
    actor_root_volume_gb    = var.actor_root_volume_gb
    actor_stop_timeout_s    = var.actor_stop_timeout_s
    engine                  = var.engine
    relay_instance_type     = var.relay_instance_type
    relay_image             = var.relay_image
    relay_root_device_name  = var.relay_root_device_name
    pip_requirements        = local.pip_requirements
    pip_extra_args          = var.pip_extra_args
    trainer_public_key      = var.trainer_public_key
    metrics_port            = var.metrics_port
    metrics_cidrs           = var.metrics_cidrs
    model_url               = var.model_url
  }
}

# --- home region ------------------------------------------------------------------------------------------

module "home_network" {
  source             = "../modules/aws-network"
  name               = "${local.name}-${var.home_region}"
  region             = var.home_region
  cidr               = local.cidrs[var.home_region]
  availability_zones = lookup(var.availability_zones, var.home_region, [])
  tags               = local.tags
}

module "home_bucket" {
  source                  = "../modules/aws-bucket"
  name                    = local.bucket_names[var.home_region]
  region                  = var.home_region
  run                     = var.run
  gc_role_arns            = [aws_iam_role.gc.arn]
  noncurrent_version_days = var.noncurrent_version_days
  force_destroy           = var.force_destroy_buckets
  tags                    = local.tags
}

module "redis" {
  source             = "../modules/aws-redis"
  name               = local.name
  run                = var.run
  vpc_id             = module.home_network.vpc_id
  subnet_ids         = module.home_network.subnet_ids
  engine             = var.redis_engine
  engine_version     = var.redis_engine_version
  node_type          = var.redis_node_type
  num_cache_clusters = var.redis_num_cache_clusters
  secret             = var.redis_auth_token
  allowed_security_groups = {
    actors  = module.home_actors.security_group_id
    trainer = aws_security_group.trainer.id
  }
  # Remote regions reach Redis over VPC peering; security groups cannot be referenced across regions, so
  # their (run-dedicated) VPC CIDRs are allowed instead.
  allowed_cidrs = concat([for region in var.remote_regions : local.cidrs[region]], var.redis_allowed_cidrs)
  tags          = local.tags
}

module "home_actors" {
  source                 = "../modules/aws-actors"
  name                   = local.name
  run                    = var.run
  region                 = var.home_region
  bucket_arn             = module.home_bucket.arn
  bucket_url             = module.home_bucket.url
  source_bucket_arn      = module.home_bucket.arn
  source_bucket_url      = module.home_bucket.url
  redis_parameter_name   = module.redis.url_parameter_names["actor"]
  redis_parameter_arn    = module.redis.url_parameter_arns["actor"]
  redis_parameter_region = var.home_region
  cache_token_parameter  = module.redis.cache_token_parameter_name
  cache_token_arn        = module.redis.cache_token_parameter_arn
  admission_secret_id    = aws_secretsmanager_secret.admission.name
  admission_secret_arn   = aws_secretsmanager_secret.admission.arn
  vpc_id                 = module.home_network.vpc_id
  subnet_ids             = module.home_network.subnet_ids
  desired_count          = local.actor_counts[var.home_region]
  instance_types         = var.actor_instance_types
  image                  = var.actor_image
  root_device_name       = var.actor_root_device_name
  root_volume_gb         = var.actor_root_volume_gb
  stop_timeout_s         = var.actor_stop_timeout_s
  engine                 = var.engine
  pip_requirements       = local.pip_requirements
  pip_extra_args         = var.pip_extra_args
  trainer_public_key     = var.trainer_public_key
  metrics_port           = var.metrics_port
  metrics_cidrs          = var.metrics_cidrs
  model_url              = var.model_url
  tags                   = local.tags
}

module "trainer" {
  source                     = "../modules/aws-trainer"
  name                       = local.name
  run                        = var.run
  region                     = var.home_region
  subnet_id                  = module.home_network.subnet_ids[0]
  availability_zone          = module.home_network.availability_zones[0]
  security_group_id          = aws_security_group.trainer.id
  instance_profile_name      = aws_iam_instance_profile.trainer.name
  instance_type              = var.trainer_instance_type
  gpus                       = var.trainer_gpus
  image                      = var.trainer_image
  root_device_name           = var.trainer_root_device_name
  root_volume_gb             = var.trainer_root_volume_gb
  data_volume_gb             = var.trainer_data_volume_gb
  data_volume_final_snapshot = var.trainer_data_volume_final_snapshot
  secret_recovery_days       = var.signing_key_recovery_days
  bucket_url                 = module.home_bucket.url
  redis_parameter_name       = module.redis.url_parameter_names["trainer"]
  redis_parameter_region     = var.home_region
  admission_secret_id        = aws_secretsmanager_secret.admission.name
  pip_requirements           = local.pip_requirements
  pip_extra_args             = var.pip_extra_args
  model_url                  = var.model_url
  metrics_port               = var.metrics_port
  metrics_cidrs              = [module.home_network.cidr] # inside the home VPC only
  trainer_args               = var.trainer_args
  stop_timeout_s             = var.trainer_stop_timeout_s
  tags                       = local.tags
}

# --- the admission secret: a secret without a value (the value never passes through Terraform or its state) --
# Actors prove their registration with it and the trainer checks it (AURORA_ADMISSION_SECRET): whoever holds
# only the Redis URL cannot join the run. The operator uploads 32 random bytes after apply, e.g.
# `python -c 'import secrets; print(secrets.token_urlsafe(32))'`; instances read it at boot, never from user data.

resource "aws_secretsmanager_secret" "admission" {
  name                    = "aurora/${var.run}/admission-secret"
  description             = "Admission secret of the Aurora run ${var.run}: actors prove registration with it"
  recovery_window_in_days = var.signing_key_recovery_days
  tags                    = local.tags
}

# --- remote regions (fixed provider slots, see providers.tf) -----------------------------------------------

module "remote1" {
  source             = "../modules/aws-remote-region"
  count              = length(var.remote_regions) >= 1 ? 1 : 0
  providers          = { aws = aws.remote1, aws.home = aws }
  region             = local.remote_slots[0]
  cidr               = local.cidrs[local.remote_slots[0]]
  availability_zones = lookup(var.availability_zones, local.remote_slots[0], [])
  bucket_name        = local.bucket_names[local.remote_slots[0]]
  actor_count        = local.actor_counts[local.remote_slots[0]]
  common             = local.common
}

module "remote2" {
  source             = "../modules/aws-remote-region"
  count              = length(var.remote_regions) >= 2 ? 1 : 0
  providers          = { aws = aws.remote2, aws.home = aws }
  region             = local.remote_slots[1]
  cidr               = local.cidrs[local.remote_slots[1]]
  availability_zones = lookup(var.availability_zones, local.remote_slots[1], [])
  bucket_name        = local.bucket_names[local.remote_slots[1]]
  actor_count        = local.actor_counts[local.remote_slots[1]]
  common             = local.common
}

module "remote3" {
  source             = "../modules/aws-remote-region"
  count              = length(var.remote_regions) >= 3 ? 1 : 0
  providers          = { aws = aws.remote3, aws.home = aws }
  region             = local.remote_slots[2]
  cidr               = local.cidrs[local.remote_slots[2]]
  availability_zones = lookup(var.availability_zones, local.remote_slots[2], [])
  bucket_name        = local.bucket_names[local.remote_slots[2]]
  actor_count        = local.actor_counts[local.remote_slots[2]]
  common             = local.common
}

locals {
  remotes     = concat(module.remote1, module.remote2, module.remote3)
  bucket_arns = concat([module.home_bucket.arn], [for remote in local.remotes : remote.bucket_arn])
}
