# The trainer: one on-demand GPU instance in the home region running `torchrun … -m workers.trainer` as a
# systemd unit. Its checkpoint directory lives on a separate EBS volume that outlives the instance (a new
# instance type or package version replaces the instance, attaches the same volume, and the trainer resumes
# from --checkpoint-dir). The signing key is a Secrets Manager secret whose value Terraform never sees: the
# operator uploads it after apply, and the instance reads it at every start of the unit into a tmpfs file.

locals {
  # The instance finds its checkpoint volume through this tag (IMDS), so the boot script is known at plan time.
  volume_tag = "aurora-checkpoint-volume"

  user_data = templatefile("${path.module}/templates/trainer-user-data.sh.tftpl", {
    run                    = var.run
    region                 = var.region
    bucket_url             = var.bucket_url
    redis_parameter_name   = var.redis_parameter_name
    redis_parameter_region = var.redis_parameter_region
    signing_key_secret_id  = aws_secretsmanager_secret.signing_key.name # known at plan time, unlike the ARN
    admission_secret_id    = var.admission_secret_id
    data_volume_tag        = local.volume_tag
    pip_requirements       = var.pip_requirements
    pip_extra_args         = var.pip_extra_args
    model_url              = var.model_url
    nproc_per_node         = tostring(var.gpus)
    metrics_port           = var.metrics_port == null ? "" : tostring(var.metrics_port)
    trainer_args           = join(" ", var.trainer_args)
    stop_timeout_s         = var.stop_timeout_s
  })
}

# --- the signing key: a secret without a value (the value never passes through Terraform or its state) -----

resource "aws_secretsmanager_secret" "signing_key" {
  name                    = "aurora/${var.run}/trainer-signing-key"
  description             = "Ed25519 signing key of the Aurora trainer (run ${var.run}): the content of `aurora keygen`'s trainer.key"
  recovery_window_in_days = var.secret_recovery_days
  tags                    = var.tags
}

# --- metrics: reachable from inside the run's network only ----------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "metrics" {
  for_each          = var.metrics_port == null ? toset([]) : toset(var.metrics_cidrs)
  security_group_id = var.security_group_id
  description       = "Prometheus metrics of the trainer (rank 0)"
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port
  cidr_ipv4         = each.value
}

# --- the checkpoint volume and the instance ---------------------------------------------------------------

resource "aws_ebs_volume" "data" {
  availability_zone = var.availability_zone
  size              = var.data_volume_gb
  type              = "gp3"
  encrypted         = true
  final_snapshot    = var.data_volume_final_snapshot
  tags              = merge(var.tags, { Name = "${var.name}-trainer-checkpoints", "aurora:role" = "trainer" })
}

# A launch template carries what an instance cannot spell itself: an image given as resolve:ssm:…
resource "aws_launch_template" "trainer" {
  name_prefix            = "${var.name}-trainer-"
  image_id               = var.image
  update_default_version = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = var.root_device_name
    ebs {
      volume_size           = var.root_volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tags = var.tags
}

resource "aws_instance" "trainer" {
  instance_type               = var.instance_type # on-demand: no instance_market_options
  subnet_id                   = var.subnet_id
  vpc_security_group_ids      = [var.security_group_id]
  iam_instance_profile        = var.instance_profile_name
  user_data                   = local.user_data
  user_data_replace_on_change = true # cloud-init runs user data once: a new package pin means a new instance

  launch_template {
    id      = aws_launch_template.trainer.id
    version = aws_launch_template.trainer.latest_version
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required" # IMDSv2 only
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled" # the boot script reads the volume tag
  }

  tags = merge(var.tags, {
    Name               = "${var.name}-trainer"
    "aurora:role"      = "trainer"
    (local.volume_tag) = aws_ebs_volume.data.id
  })
}

resource "aws_volume_attachment" "data" {
  device_name                    = "/dev/sdf"
  volume_id                      = aws_ebs_volume.data.id
  instance_id                    = aws_instance.trainer.id
  stop_instance_before_detaching = true # the trainer gets SIGTERM and saves before the volume goes
}
