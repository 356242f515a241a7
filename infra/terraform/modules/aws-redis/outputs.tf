output "url" {
  description = "The operator's URL, rediss://operator:<password>@host:port/0 (every command; never given to an instance)."
  value       = local.urls["operator"]
  sensitive   = true
}

output "role_urls" {
  description = "URL of each role's user (role => rediss://<role>:<password>@host:port/0)."
  value       = { for role in local.roles : role => local.urls[role] }
  sensitive   = true
}

output "host" {
  value = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "port" {
  value = local.port
}

output "security_group_id" {
  value = aws_security_group.redis.id
}

output "user_group_id" {
  value = aws_elasticache_user_group.this.user_group_id
}

output "url_parameter_names" {
  description = "SSM parameter (SecureString) holding each role's Redis URL (role => name)."
  value       = { for role, p in aws_ssm_parameter.url : role => p.name }
}

output "url_parameter_arns" {
  description = "ARN of each role's URL parameter (role => ARN)."
  value       = { for role, p in aws_ssm_parameter.url : role => p.arn }
}

output "cache_token_parameter_name" {
  description = "SSM parameter (SecureString) holding the relays' cache token."
  value       = aws_ssm_parameter.cache_token.name
}

output "cache_token_parameter_arn" {
  value = aws_ssm_parameter.cache_token.arn
}
