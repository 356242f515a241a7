# The relay of one remote region: one on-demand VM (a managed instance group of one, so a failed VM is
# recreated) running `python -m workers.relay` from the home bucket into this region's bucket.

locals {
  startup_script = templatefile("${path.module}/templates/relay-startup.sh.tftpl", {
    run                = var.run
    region             = var.region
    source_bucket_url  = var.source_bucket_url
    bucket_url         = var.bucket_url
    redis_secret_id    = var.redis_secret_id
    redis_ca_cert      = var.redis_ca_cert
    redis_ca_path      = var.redis_ca_path
    pip_requirements   = var.pip_requirements
    pip_extra_args     = var.pip_extra_args
    trainer_public_key = var.trainer_public_key
    metrics_port       = var.metrics_port == null ? "" : tostring(var.metrics_port)
    model_url          = var.model_url
    stop_timeout_s     = var.stop_timeout_s
    cache_port         = var.cache_port
  })
}

# --- identity: read the source bucket; create (never replace) published versions in the regional one ------

resource "google_service_account" "relay" {
  account_id   = "${substr(var.name, 0, 14)}-rly-${substr(sha1(var.region), 0, 8)}"
  display_name = "Aurora relay ${var.run} ${var.region}"
}

resource "google_storage_bucket_iam_member" "read" {
  for_each = toset([var.source_bucket_name, var.bucket_name])
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = google_service_account.relay.member
}

# objectCreator: new objects only, no overwrite, no delete (deltas/, manifests, layouts/ stay immutable).
resource "google_storage_bucket_iam_member" "create" {
  bucket = var.bucket_name
  role   = "roles/storage.objectCreator"
  member = google_service_account.relay.member
}

# Idempotent rewrites (segments re-copied after a lost response, run.json, latest.json) need
# storage.objects.delete on GCS; grant it only for those names.
resource "google_storage_bucket_iam_member" "rewrite" {
  bucket = var.bucket_name
  role   = "roles/storage.objectUser"
  member = google_service_account.relay.member
  condition {
    title       = "aurora-rewritable-objects"
    description = "Pointers and content-addressed objects; never deltas/, layouts/ or snapshot manifests"
    expression  = var.bucket_rewritable_condition
  }
}

resource "google_secret_manager_secret_iam_member" "redis_url" {
  secret_id = var.redis_secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.relay.member
}

# --- instance -------------------------------------------------------------------------------------------------

resource "google_compute_instance_template" "relay" {
  name_prefix  = "${var.name}-relay-"
  region       = var.region
  machine_type = var.machine_type
  tags         = concat(["aurora-relay"], var.metrics_port == null ? [] : ["aurora-metrics"])
  labels       = merge(var.labels, { aurora-run = var.run, aurora-role = "relay" })

  disk {
    source_image = var.image
    boot         = true
    auto_delete  = true
    disk_size_gb = var.disk_gb
    disk_type    = "pd-balanced"
  }

  network_interface {
    subnetwork = var.subnetwork_id
  }

  scheduling {
    provisioning_model  = "STANDARD"
    automatic_restart   = true
    on_host_maintenance = "MIGRATE"
  }

  service_account {
    email  = google_service_account.relay.email
    scopes = ["cloud-platform"]
  }

  metadata = {
    startup-script         = local.startup_script
    shutdown-script        = "#!/bin/bash\nsystemctl stop aurora-relay.service\n"
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = "TRUE"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_region_instance_group_manager" "relay" {
  name               = "${var.name}-relay-${var.region}"
  region             = var.region
  base_instance_name = "${var.name}-relay"
  target_size        = 1

  version {
    instance_template = google_compute_instance_template.relay.id
  }
}

# --- the segment cache: reachable from this region's subnet only (bearer token required) -----------------

resource "google_compute_firewall" "cache" {
  name          = "${var.name}-relay-cache-${var.region}"
  network       = var.network_id
  direction     = "INGRESS"
  source_ranges = [var.subnet_cidr]
  target_tags   = ["aurora-relay"]

  allow {
    protocol = "tcp"
    ports    = [tostring(var.cache_port)]
  }
}
