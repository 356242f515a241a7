output "security_group_id" {
  value = aws_security_group.actor.id
}

output "role_arn" {
  value = aws_iam_role.actor.arn
}

output "autoscaling_group_name" {
  value = aws_autoscaling_group.actor.name
}

output "user_data" {
  description = "The rendered startup script (no secrets: the Redis URL is read from SSM at boot)."
  value       = local.user_data
}
