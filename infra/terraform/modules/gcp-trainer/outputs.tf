output "instance_name" {
  value = google_compute_instance.trainer.name
}

output "internal_ip" {
  description = "Where the trainer's metrics are scraped from inside the VPC."
  value       = google_compute_instance.trainer.network_interface[0].network_ip
}

output "signing_key_secret_id" {
  description = "Secret Manager secret (projects/<p>/secrets/<id>) the trainer reads its signing key from."
  value       = google_secret_manager_secret.signing_key.id
}

output "startup_script" {
  description = "The rendered startup script (no secrets)."
  value       = local.startup_script
}
