# Rollout actors of one region on Spot VMs: an instance template with provisioning_model = "SPOT" and a
# regional managed instance group that recreates preempted instances. The startup script installs the
# package and runs `python -m workers.actor` as aurora-actor.service; the shutdown script (which GCE runs
# on preemption, ~30 s before the VM stops) stops that unit, i.e. sends SIGTERM, so the actor hands its
# leases back and deregisters.

locals {
  source_bucket_url = var.source_bucket_url == var.bucket_url ? "" : var.source_bucket_url
  readable_buckets  = toset(distinct([var.bucket_name, var.source_bucket_name]))

  startup_script = templatefile("${path.module}/templates/actor-startup.sh.tftpl", {
    run                 = var.run
    region              = var.region
    bucket_url          = var.bucket_url
    source_bucket_url   = local.source_bucket_url
    redis_secret_id     = var.redis_secret_id
    admission_secret_id = var.admission_secret_id
    redis_ca_cert       = var.redis_ca_cert
    redis_ca_path       = var.redis_ca_path
    pip_requirements    = var.pip_requirements
    pip_extra_args      = var.pip_extra_args
    engine              = var.engine
    trainer_public_key  = var.trainer_public_key
    metrics_port        = var.metrics_port == null ? "" : tostring(var.metrics_port)
    model_url           = var.model_url
    stop_timeout_s      = var.stop_timeout_s
  })
  shutdown_script = file("${path.module}/templates/actor-shutdown.sh")
}

# --- identity: read-only on the regional bucket and the source bucket -----------------------------------

resource "google_service_account" "actor" {
  account_id   = "${substr(var.name, 0, 14)}-act-${substr(sha1(var.region), 0, 8)}"
  display_name = "Aurora actor ${var.run} ${var.region}"
}

resource "google_storage_bucket_iam_member" "read" {
  for_each = local.readable_buckets
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = google_service_account.actor.member
}

resource "google_secret_manager_secret_iam_member" "redis_url" {
  secret_id = var.redis_secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.actor.member
}

resource "google_secret_manager_secret_iam_member" "admission" {
  secret_id = var.admission_secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.actor.member
}

# --- instances ----------------------------------------------------------------------------------------------

resource "google_compute_instance_template" "actor" {
  name_prefix  = "${var.name}-actor-"
  region       = var.region
  machine_type = var.machine_type
  tags         = var.metrics_port == null ? [] : ["aurora-metrics"]
  labels       = merge(var.labels, { aurora-run = var.run, aurora-role = "actor" })

  disk {
    source_image = var.image
    boot         = true
    auto_delete  = true
    disk_size_gb = var.disk_gb
    disk_type    = "pd-balanced"
  }

  network_interface {
    subnetwork = var.subnetwork_id # no access_config: no external address, egress through Cloud NAT
  }

  dynamic "guest_accelerator" {
    for_each = var.gpu_type == "" ? [] : [var.gpu_type]
    content {
      type  = guest_accelerator.value
      count = var.gpu_count
    }
  }

  scheduling {
    provisioning_model          = "SPOT"
    preemptible                 = true
    automatic_restart           = false
    on_host_maintenance         = "TERMINATE"
    instance_termination_action = "DELETE" # the instance group recreates it when capacity returns
  }

  service_account {
    email  = google_service_account.actor.email
    scopes = ["cloud-platform"] # access is limited by the service account's IAM grants above
  }

  metadata = {
    startup-script         = local.startup_script
    shutdown-script        = local.shutdown_script
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = "TRUE"
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_region_instance_group_manager" "actor" {
  name               = "${var.name}-actors-${var.region}"
  region             = var.region
  base_instance_name = "${var.name}-actor"
  target_size        = var.desired_count

  version {
    instance_template = google_compute_instance_template.actor.id
  }
}
