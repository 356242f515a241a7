# The control plane: an ElastiCache (Valkey/Redis) replication group carrying the run's Redis Streams.
# Encrypted in transit (TLS, `rediss://`) and at rest, AUTH required, and reachable only from the run's
# own security groups (home region) and peered VPC CIDRs (remote regions) on port 6379.

locals {
  port = 6379
}

resource "aws_security_group" "redis" {
  name        = "${var.name}-redis"
  description = "Aurora control plane: Redis port from the run's actors, relays and trainer only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-redis" })
}

resource "aws_vpc_security_group_ingress_rule" "from_security_groups" {
  for_each                     = var.allowed_security_groups
  security_group_id            = aws_security_group.redis.id
  description                  = "Redis from ${each.key}"
  ip_protocol                  = "tcp"
  from_port                    = local.port
  to_port                      = local.port
  referenced_security_group_id = each.value
}

resource "aws_vpc_security_group_ingress_rule" "from_cidrs" {
  for_each          = toset(var.allowed_cidrs)
  security_group_id = aws_security_group.redis.id
  description       = "Redis from peered run network ${each.value}"
  ip_protocol       = "tcp"
  from_port         = local.port
  to_port           = local.port
  cidr_ipv4         = each.value
}

resource "aws_elasticache_subnet_group" "this" {
  name       = "${var.name}-redis"
  subnet_ids = var.subnet_ids
  tags       = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id       = var.name
  description                = "Aurora control plane for run ${var.run}"
  engine                     = var.engine
  engine_version             = var.engine_version
  node_type                  = var.node_type
  port                       = local.port
  num_cache_clusters         = var.num_cache_clusters
  automatic_failover_enabled = var.num_cache_clusters > 1
  multi_az_enabled           = var.num_cache_clusters > 1
  subnet_group_name          = aws_elasticache_subnet_group.this.name
  security_group_ids         = [aws_security_group.redis.id]
  at_rest_encryption_enabled = true
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = var.auth_token
  auth_token_update_strategy = "ROTATE"
  apply_immediately          = true
  snapshot_retention_limit   = 1
  tags                       = var.tags
}

locals {
  url = "rediss://:${var.auth_token}@${aws_elasticache_replication_group.this.primary_endpoint_address}:${local.port}/0"
}

# Instances read the URL (it embeds the AUTH token) from here at boot, so it never appears in user data.
# SecureString under the AWS-managed key alias/aws/ssm: ssm:GetParameter on this one ARN is all a role needs.
resource "aws_ssm_parameter" "url" {
  name        = "/aurora/${var.run}/redis-url"
  description = "Redis URL (with AUTH token) of Aurora run ${var.run}"
  type        = "SecureString"
  value       = local.url
  tags        = var.tags
}
