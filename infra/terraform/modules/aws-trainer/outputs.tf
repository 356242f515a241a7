output "instance_id" {
  value = aws_instance.trainer.id
}

output "private_ip" {
  description = "Where the trainer's metrics are scraped from inside the VPC."
  value       = aws_instance.trainer.private_ip
}

output "data_volume_id" {
  value = aws_ebs_volume.data.id
}

output "signing_key_secret_arn" {
  value = aws_secretsmanager_secret.signing_key.arn
}

output "signing_key_secret_name" {
  value = aws_secretsmanager_secret.signing_key.name
}

output "user_data" {
  description = "The rendered boot script (no secrets: it fetches the Redis URL and the signing key at boot)."
  value       = local.user_data
}
