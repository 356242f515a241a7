output "url" {
  description = "rediss://:<token>@host:port/0"
  value       = local.url
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

output "url_parameter_name" {
  description = "SSM parameter (SecureString) holding the Redis URL."
  value       = aws_ssm_parameter.url.name
}

output "url_parameter_arn" {
  value = aws_ssm_parameter.url.arn
}
