# The control plane: a Memorystore for Redis instance with AUTH and in-transit encryption (TLS, served on
# port 6378 with a per-instance CA), reachable only from the run's VPC. Its URL (with the AUTH string) is
# kept in Secret Manager; instances read it at boot with their own service account.

resource "google_redis_instance" "this" {
  name                    = var.name
  region                  = var.region
  tier                    = var.tier
  memory_size_gb          = var.memory_size_gb
  redis_version           = var.redis_version
  authorized_network      = var.network_id
  connect_mode            = "DIRECT_PEERING"
  auth_enabled            = true
  transit_encryption_mode = "SERVER_AUTHENTICATION"
  display_name            = "Aurora control plane (${var.run})"
  labels                  = merge(var.labels, { aurora-run = var.run })
}

locals {
  base_url = "rediss://:${google_redis_instance.this.auth_string}@${google_redis_instance.this.host}:${google_redis_instance.this.port}/0"
  ca_path  = "/etc/aurora/redis-ca.pem"
  # On instances: verify the server against the instance's own CA (written to ca_path at boot). That CA is
  # unique to this instance, so the chain check authenticates the server; clients connect by IP address,
  # hence no hostname check.
  instance_url = "${local.base_url}?ssl_ca_certs=${local.ca_path}&ssl_check_hostname=false"
}

resource "google_secret_manager_secret" "url" {
  secret_id = "${var.name}-redis-url"
  labels    = merge(var.labels, { aurora-run = var.run })
  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "url" {
  secret      = google_secret_manager_secret.url.id
  secret_data = local.instance_url
}
