output "bucket_urls" {
  description = "Bucket URL per region (--bucket for that region's actors)."
  value = merge(
    { (var.home_region) = module.home_bucket.url },
    { for remote in local.remotes : remote.region => remote.bucket_url },
  )
  precondition {
    condition     = !contains(var.remote_regions, var.home_region)
    error_message = "remote_regions must not contain home_region (the home region has no relay)."
  }
}

output "home_bucket_url" {
  description = "The trainer's bucket (the source of every relay)."
  value       = module.home_bucket.url
}

output "redis_url" {
  description = "The operator's control plane URL, rediss://operator:<password>@host:port/0 (`terraform output -raw redis_url`): every command, for `aurora status`/`gc`; no instance holds it."
  value       = module.redis.url
  sensitive   = true
}

output "redis_url_parameters" {
  description = "SSM parameter (SecureString, home region) holding each role's Redis URL (trainer, relay, actor => name)."
  value       = module.redis.url_parameter_names
}

output "trainer_instance_profile" {
  description = "Instance profile for the trainer (writes the home bucket)."
  value       = aws_iam_instance_profile.trainer.name
}

output "trainer_security_group_id" {
  description = "Security group for the trainer (allowed to reach Redis)."
  value       = aws_security_group.trainer.id
}

output "trainer_subnet_ids" {
  description = "Home-region subnets to launch the trainer in."
  value       = module.home_network.subnet_ids
}

output "trainer_instance_id" {
  description = "The trainer's instance (on-demand GPU; `journalctl -u aurora-trainer` there)."
  value       = module.trainer.instance_id
}

output "trainer_private_ip" {
  description = "The trainer's address inside the home VPC (metrics_port is reachable from the VPC only)."
  value       = module.trainer.private_ip
}

output "trainer_signing_key_secret" {
  description = "Secrets Manager secret (ARN) the trainer reads its signing key from: put `aurora keygen`'s trainer.key there."
  value       = module.trainer.signing_key_secret_arn
}

output "trainer_user_data" {
  description = "The trainer's rendered boot script (no secrets)."
  value       = module.trainer.user_data
}

output "gc_role_arn" {
  description = "Role to assume for `aurora gc` (the only identity allowed to delete version data)."
  value       = aws_iam_role.gc.arn
}

output "actor_autoscaling_groups" {
  description = "Actor auto-scaling group per region."
  value = merge(
    { (var.home_region) = module.home_actors.autoscaling_group_name },
    { for remote in local.remotes : remote.region => remote.actor_autoscaling_group },
  )
}

output "relay_autoscaling_groups" {
  description = "Relay auto-scaling group per remote region."
  value       = { for remote in local.remotes : remote.region => remote.relay_autoscaling_group }
}

output "actor_user_data" {
  description = "Rendered actor startup script per region (no secrets)."
  value = merge(
    { (var.home_region) = module.home_actors.user_data },
    { for remote in local.remotes : remote.region => remote.actor_user_data },
  )
}

output "relay_user_data" {
  description = "Rendered relay startup script per remote region (no secrets)."
  value       = { for remote in local.remotes : remote.region => remote.relay_user_data }
}
