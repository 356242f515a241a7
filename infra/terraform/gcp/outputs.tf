output "bucket_urls" {
  description = "Bucket URL per region (--bucket for that region's actors)."
  value       = { for region, bucket in module.bucket : region => bucket.url }
  precondition {
    condition     = !contains(var.remote_regions, var.home_region)
    error_message = "remote_regions must not contain home_region (the home region has no relay)."
  }
}

output "home_bucket_url" {
  description = "The trainer's bucket (the source of every relay)."
  value       = local.home_bucket.url
}

output "redis_url" {
  description = "Control plane URL, rediss://:<auth>@host:port/0 (verify TLS with redis_ca_cert)."
  value       = module.redis.url
  sensitive   = true
}

output "redis_ca_cert" {
  description = "Memorystore server CA (PEM): pass ?ssl_ca_certs=<file> in the URL from outside the VMs."
  value       = module.redis.ca_cert
}

output "redis_url_secret" {
  description = "Secret Manager secret with the URL the VMs use."
  value       = module.redis.secret_id
}

output "trainer_service_account" {
  description = "Service account for the trainer VM (writes the home bucket)."
  value       = google_service_account.trainer.email
}

output "trainer_subnetwork" {
  description = "Subnetwork to put the trainer VM in (it must reach Memorystore)."
  value       = module.network.subnetwork_ids[var.home_region]
}

output "gc_service_account" {
  description = "Service account to impersonate for `aurora gc`."
  value       = google_service_account.gc.email
}

output "actor_instance_groups" {
  value = { for region, actors in module.actors : region => actors.instance_group }
}

output "relay_instance_groups" {
  value = { for region, relay in module.relay : region => relay.instance_group }
}

output "trainer_instance" {
  description = "The trainer VM (on-demand GPU; `journalctl -u aurora-trainer` there)."
  value       = module.trainer.instance_name
}

output "trainer_internal_ip" {
  description = "The trainer's address inside the VPC (metrics_port is reachable from the run's subnets only)."
  value       = module.trainer.internal_ip
}

output "trainer_signing_key_secret" {
  description = "Secret Manager secret the trainer reads its signing key from: add `aurora keygen`'s trainer.key as a version."
  value       = module.trainer.signing_key_secret_id
}

output "trainer_startup_script" {
  description = "The trainer's rendered startup script (no secrets)."
  value       = module.trainer.startup_script
}
