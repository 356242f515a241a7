output "service_account" {
  value = google_service_account.relay.email
}

output "instance_group" {
  value = google_compute_region_instance_group_manager.relay.name
}

output "startup_script" {
  value = local.startup_script
}
