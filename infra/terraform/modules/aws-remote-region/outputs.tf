output "region" {
  value = var.region
}

output "bucket_url" {
  value = module.bucket.url
}

output "bucket_arn" {
  value = module.bucket.arn
}

output "cidr" {
  value = module.network.cidr
}

output "actor_role_arn" {
  value = module.actors.role_arn
}

output "relay_role_arn" {
  value = module.relay.role_arn
}

output "actor_autoscaling_group" {
  value = module.actors.autoscaling_group_name
}

output "relay_autoscaling_group" {
  value = module.relay.autoscaling_group_name
}

output "actor_user_data" {
  value = module.actors.user_data
}

output "relay_user_data" {
  value = module.relay.user_data
}
