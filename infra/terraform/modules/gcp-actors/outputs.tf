output "service_account" {
  value = google_service_account.actor.email
}

output "instance_group" {
  value = google_compute_region_instance_group_manager.actor.name
}

output "startup_script" {
  description = "The rendered startup script (no secrets: the Redis URL is read from Secret Manager at boot)."
  value       = local.startup_script
}
