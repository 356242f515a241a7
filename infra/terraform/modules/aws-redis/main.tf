# The control plane: an ElastiCache (Valkey/Redis) replication group carrying the run's Redis Streams.
# Encrypted in transit (TLS, `rediss://`) and at rest, reachable only from the run's own security groups (home
# region) and peered VPC CIDRs (remote regions) on port 6379, and every client authenticates as an RBAC user of
# the run's user group: one per role (trainer, relay, actor) with the rules of aurora_store/bus/acl.py
# (access_strings.tf), the operator with every command, and a disabled "default" (a user group must hold one).

locals {
  port  = 6379
  roles = ["trainer", "relay", "actor"]
  # Every password is derived one-way from the run's Redis secret (no password generator is needed at plan time):
  # 64 hex digits each, and holding one role's password reveals neither the secret nor another role's password.
  passwords = {
    for user in concat(local.roles, ["operator", "default"]) : user => sha256("aurora-redis-user:${user}:${var.secret}")
  }
  host = aws_elasticache_replication_group.this.primary_endpoint_address
  urls = {
    for user in concat(local.roles, ["operator"]) : user => "rediss://${user}:${local.passwords[user]}@${local.host}:${local.port}/0"
  }
  # The relays' segment-cache bearer token: shared by the region's relay and actors, whose Redis URLs differ.
  cache_token = sha256("aurora-cache-token:${var.secret}")
}

# --- users and their group (RBAC replaces the AUTH token) -------------------------------------------------------

resource "aws_elasticache_user" "default" {
  user_id       = "${var.name}-default"
  user_name     = "default"
  engine        = "redis"
  access_string = "off -@all"
  authentication_mode {
    type      = "password"
    passwords = [local.passwords["default"]]
  }
  tags = var.tags
}

resource "aws_elasticache_user" "operator" {
  user_id       = "${var.name}-operator"
  user_name     = "operator"
  engine        = "redis"
  access_string = "on ~* &* +@all"
  authentication_mode {
    type      = "password"
    passwords = [local.passwords["operator"]]
  }
  tags = var.tags
}

resource "aws_elasticache_user" "role" {
  for_each      = toset(local.roles)
  user_id       = "${var.name}-${each.key}"
  user_name     = each.key
  engine        = "redis"
  access_string = local.access_strings[each.key]
  authentication_mode {
    type      = "password"
    passwords = [local.passwords[each.key]]
  }
  tags = var.tags
}

resource "aws_elasticache_user_group" "this" {
  user_group_id = "${var.name}-users"
  engine        = "redis"
  user_ids = concat(
    [aws_elasticache_user.default.user_id, aws_elasticache_user.operator.user_id],
    [for role in local.roles : aws_elasticache_user.role[role].user_id],
  )
  tags = var.tags
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
  user_group_ids             = [aws_elasticache_user_group.this.user_group_id]
  apply_immediately          = true
  snapshot_retention_limit   = 1
  tags                       = var.tags
}

# Instances read their role's URL (it embeds the role's password) from here at boot, so it never appears in user
# data. SecureString under the AWS-managed key alias/aws/ssm: ssm:GetParameter on one ARN is all a role needs, and
# each role's policy names only its own parameter. The operator's URL is a (sensitive) output only.
resource "aws_ssm_parameter" "url" {
  for_each    = toset(local.roles)
  name        = "/aurora/${var.run}/redis-url/${each.key}"
  description = "Redis URL of the ${each.key} user of Aurora run ${var.run}"
  type        = "SecureString"
  value       = local.urls[each.key]
  tags        = var.tags
}

# The relays' cache token (AURORA_CACHE_TOKEN), read at boot by relays and actors only.
resource "aws_ssm_parameter" "cache_token" {
  name        = "/aurora/${var.run}/cache-token"
  description = "Bearer token of the relays' segment caches of Aurora run ${var.run}"
  type        = "SecureString"
  value       = local.cache_token
  tags        = var.tags
}
