# The trainer: one on-demand GPU VM in the home region running `torchrun … -m workers.trainer` as a systemd
# unit, its checkpoint directory on a separate persistent disk that outlives the VM (a replaced VM attaches the
# same disk and the trainer resumes). The signing key is a Secret Manager secret whose value Terraform never
# sees: the operator adds a version after apply; the VM reads it at every start of the unit into tmpfs.

locals {
  disk_device = "aurora-ckpt" # /dev/disk/by-id/google-<device_name>

  startup_script = templatefile("${path.module}/templates/trainer-startup.sh.tftpl", {
    run                   = var.run
    region                = var.region
    bucket_url            = var.bucket_url
    redis_secret_id       = var.redis_secret_id
    redis_ca_cert         = var.redis_ca_cert
    redis_ca_path         = var.redis_ca_path
    signing_key_secret_id = google_secret_manager_secret.signing_key.id
    admission_secret_id   = var.admission_secret_id
    data_device           = "/dev/disk/by-id/google-${local.disk_device}"
    pip_requirements      = var.pip_requirements
    pip_extra_args        = var.pip_extra_args
    model_url             = var.model_url
    nproc_per_node        = tostring(var.gpus)
    metrics_port          = var.metrics_port == null ? "" : tostring(var.metrics_port)
    trainer_args          = join(" ", var.trainer_args)
    stop_timeout_s        = var.stop_timeout_s
  })
}

# --- the signing key: a secret without a version (the value never passes through Terraform or its state) ----

resource "google_secret_manager_secret" "signing_key" {
  secret_id = "${var.name}-trainer-signing-key"
  labels    = var.labels
  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_iam_member" "signing_key" {
  secret_id = google_secret_manager_secret.signing_key.id
  role      = "roles/secretmanager.secretAccessor"
  member    = var.service_account_member
}

# --- metrics: reachable from the run's subnets only -------------------------------------------------------------

resource "google_compute_firewall" "metrics" {
  count         = var.metrics_port == null ? 0 : 1
  name          = "${var.name}-trainer-metrics"
  network       = var.network_id
  direction     = "INGRESS"
  source_ranges = var.metrics_cidrs
  target_tags   = ["aurora-trainer"]
  allow {
    protocol = "tcp"
    ports    = [tostring(var.metrics_port)]
  }
}

# --- the checkpoint disk and the VM -----------------------------------------------------------------------------

resource "google_compute_disk" "data" {
  name   = "${var.name}-trainer-checkpoints"
  zone   = var.zone
  size   = var.data_disk_gb
  type   = "pd-ssd"
  labels = merge(var.labels, { aurora-role = "trainer" })
}

resource "google_compute_instance" "trainer" {
  name                      = "${var.name}-trainer"
  zone                      = var.zone
  machine_type              = var.machine_type
  tags                      = ["aurora-trainer"]
  labels                    = merge(var.labels, { aurora-run = var.run, aurora-role = "trainer" })
  allow_stopping_for_update = true

  boot_disk {
    initialize_params {
      image = var.image
      size  = var.boot_disk_gb
      type  = "pd-balanced"
    }
  }

  attached_disk {
    source      = google_compute_disk.data.id
    device_name = local.disk_device
  }

  dynamic "guest_accelerator" {
    for_each = var.gpu_type == "" ? [] : [var.gpu_type]
    content {
      type  = guest_accelerator.value
      count = var.gpu_count
    }
  }

  network_interface {
    subnetwork = var.subnetwork_id # no external address: egress through Cloud NAT
  }

  # On-demand (STANDARD), never Spot; GPU VMs cannot live-migrate, so host maintenance stops and restarts it.
  scheduling {
    provisioning_model  = "STANDARD"
    preemptible         = false
    automatic_restart   = true
    on_host_maintenance = "TERMINATE"
  }

  service_account {
    email  = var.service_account_email
    scopes = ["cloud-platform"]
  }

  metadata = {
    startup-script         = local.startup_script
    shutdown-script        = "#!/bin/bash\nsystemctl stop aurora-trainer.service\n"
    enable-oslogin         = "TRUE"
    block-project-ssh-keys = "TRUE"
  }
}
