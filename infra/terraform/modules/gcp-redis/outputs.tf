output "url" {
  description = "rediss://:<auth>@host:port/0"
  value       = local.base_url
  sensitive   = true
}

output "ca_cert" {
  description = "PEM of the instance's server CA (clients verify TLS against it)."
  value       = google_redis_instance.this.server_ca_certs[0].cert
}

output "ca_path" {
  description = "Where instances keep the CA (referenced by the URL in the secret)."
  value       = local.ca_path
}

output "secret_id" {
  description = "Secret Manager secret (projects/<p>/secrets/<id>) holding the instances' Redis URL."
  value       = google_secret_manager_secret.url.id
}

output "host" {
  value = google_redis_instance.this.host
}

output "port" {
  value = google_redis_instance.this.port
}
