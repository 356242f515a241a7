# Everything a remote region needs: its network (peered with the home VPC so instances reach the control
# plane), its bucket, its spot actors and its relay (home bucket -> this region's bucket).

locals {
  c = var.common
}

module "network" {
  source             = "../aws-network"
  name               = "${local.c.name}-${var.region}"
  region             = var.region
  cidr               = var.cidr
  availability_zones = var.availability_zones
  tags               = local.c.tags
}

module "bucket" {
  source                  = "../aws-bucket"
  name                    = var.bucket_name
  region                  = var.region
  run                     = local.c.run
  gc_role_arns            = local.c.gc_role_arns
  versioning              = local.c.versioning
  noncurrent_version_days = local.c.noncurrent_version_days
  force_destroy           = local.c.force_destroy
  tags                    = local.c.tags
}

module "actors" {
  source                 = "../aws-actors"
  name                   = local.c.name
  run                    = local.c.run
  region                 = var.region
  bucket_arn             = module.bucket.arn
  bucket_url             = module.bucket.url
  source_bucket_arn      = local.c.source_bucket_arn
  source_bucket_url      = local.c.source_bucket_url
  redis_parameter_name   = local.c.actor_redis_parameter
  redis_parameter_arn    = local.c.actor_redis_arn
  redis_parameter_region = local.c.home_region
  cache_token_parameter  = local.c.cache_token_parameter
  cache_token_arn        = local.c.cache_token_arn
  admission_secret_id    = local.c.admission_secret_id
  admission_secret_arn   = local.c.admission_secret_arn
  vpc_id                 = module.network.vpc_id
  subnet_ids             = module.network.subnet_ids
  desired_count          = var.actor_count
  instance_types         = local.c.actor_instance_types
  image                  = local.c.actor_image
  root_device_name       = local.c.actor_root_device_name
  root_volume_gb         = local.c.actor_root_volume_gb
  stop_timeout_s         = local.c.actor_stop_timeout_s
  engine                 = local.c.engine
  pip_requirements       = local.c.pip_requirements
  pip_extra_args         = local.c.pip_extra_args
  trainer_public_key     = local.c.trainer_public_key
  metrics_port           = local.c.metrics_port
  metrics_cidrs          = local.c.metrics_cidrs
  model_url              = local.c.model_url
  tags                   = local.c.tags
}

module "relay" {
  source                 = "../aws-relay"
  name                   = local.c.name
  run                    = local.c.run
  region                 = var.region
  bucket_arn             = module.bucket.arn
  bucket_url             = module.bucket.url
  source_bucket_arn      = local.c.source_bucket_arn
  source_bucket_url      = local.c.source_bucket_url
  redis_parameter_name   = local.c.relay_redis_parameter
  redis_parameter_arn    = local.c.relay_redis_arn
  redis_parameter_region = local.c.home_region
  cache_token_parameter  = local.c.cache_token_parameter
  cache_token_arn        = local.c.cache_token_arn
  vpc_id                 = module.network.vpc_id
  vpc_cidr               = module.network.cidr
  subnet_ids             = module.network.subnet_ids
  instance_type          = local.c.relay_instance_type
  image                  = local.c.relay_image
  root_device_name       = local.c.relay_root_device_name
  pip_requirements       = local.c.pip_requirements
  pip_extra_args         = local.c.pip_extra_args
  trainer_public_key     = local.c.trainer_public_key
  metrics_port           = local.c.metrics_port
  metrics_cidrs          = local.c.metrics_cidrs
  model_url              = local.c.model_url
  tags                   = local.c.tags
}

# --- inter-region VPC peering with the home VPC (the control plane lives there) --------------------------

resource "aws_vpc_peering_connection" "home" {
  vpc_id      = module.network.vpc_id
  peer_vpc_id = local.c.home_vpc_id
  peer_region = local.c.home_region
  tags        = merge(local.c.tags, { Name = "${local.c.name}-${var.region}-to-home" })
}

resource "aws_vpc_peering_connection_accepter" "home" {
  provider                  = aws.home
  vpc_peering_connection_id = aws_vpc_peering_connection.home.id
  auto_accept               = true
  tags                      = merge(local.c.tags, { Name = "${local.c.name}-${var.region}-to-home" })
}

resource "aws_route" "to_home" {
  route_table_id            = module.network.route_table_id
  destination_cidr_block    = local.c.home_cidr
  vpc_peering_connection_id = aws_vpc_peering_connection_accepter.home.id
}

resource "aws_route" "from_home" {
  provider                  = aws.home
  route_table_id            = local.c.home_route_table_id
  destination_cidr_block    = var.cidr
  vpc_peering_connection_id = aws_vpc_peering_connection_accepter.home.id
}
