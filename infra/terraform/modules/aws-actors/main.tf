# Rollout actors of one region on spot capacity: an auto-scaling group with a mixed-instances policy that
# is 100% spot. Each instance runs `python -m workers.actor` as the systemd unit aurora-actor.service;
# aurora-spot-watch.service polls the spot interruption notice and stops the actor (SIGTERM) so it hands
# its leases back and deregisters before the instance is reclaimed.

locals {
  # --source-bucket only where it differs from --bucket (remote regions): the fallback when the relay is down.
  source_bucket_url = var.source_bucket_url == var.bucket_url ? "" : var.source_bucket_url
  bucket_arns       = distinct([var.bucket_arn, var.source_bucket_arn])

  user_data = templatefile("${path.module}/templates/actor-user-data.sh.tftpl", {
    run                    = var.run
    region                 = var.region
    bucket_url             = var.bucket_url
    source_bucket_url      = local.source_bucket_url
    redis_parameter_name   = var.redis_parameter_name
    redis_parameter_region = var.redis_parameter_region
    cache_token_parameter  = var.cache_token_parameter
    admission_secret_id    = var.admission_secret_id
    pip_requirements       = var.pip_requirements
    pip_extra_args         = var.pip_extra_args
    engine                 = var.engine
    trainer_public_key     = var.trainer_public_key
    metrics_port           = var.metrics_port == null ? "" : tostring(var.metrics_port)
    model_url              = var.model_url
    stop_timeout_s         = var.stop_timeout_s
  })
}

# --- identity: read-only on the regional bucket and the source bucket, nothing else -------------------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "actor" {
  name               = "${var.name}-actor-${var.region}"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "actor" {
  statement {
    sid       = "ListBuckets"
    actions   = ["s3:ListBucket"]
    resources = local.bucket_arns
  }
  statement {
    sid       = "ReadVersions"
    actions   = ["s3:GetObject"]
    resources = [for arn in local.bucket_arns : "${arn}/*"]
  }
  statement {
    sid       = "ReadRedisUrl"
    actions   = ["ssm:GetParameter"]
    resources = [var.redis_parameter_arn] # the actor user's URL, no other role's
  }
  statement {
    sid       = "ReadCacheToken"
    actions   = ["ssm:GetParameter"]
    resources = [var.cache_token_arn]
  }
  statement {
    sid       = "ReadAdmissionSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.admission_secret_arn]
  }
}

resource "aws_iam_role_policy" "actor" {
  name   = "aurora-actor"
  role   = aws_iam_role.actor.id
  policy = data.aws_iam_policy_document.actor.json
}

resource "aws_iam_instance_profile" "actor" {
  name = aws_iam_role.actor.name
  role = aws_iam_role.actor.name
  tags = var.tags
}

# --- network: no inbound traffic except an optional metrics port ---------------------------------------

resource "aws_security_group" "actor" {
  name        = "${var.name}-actor"
  description = "Aurora actors: outbound only (plus metrics scraping when enabled)"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-actor" })
}

resource "aws_vpc_security_group_egress_rule" "actor_all" {
  security_group_id = aws_security_group.actor.id
  description       = "Buckets, Redis, package index"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

resource "aws_vpc_security_group_ingress_rule" "actor_metrics" {
  for_each          = var.metrics_port == null ? toset([]) : toset(var.metrics_cidrs)
  security_group_id = aws_security_group.actor.id
  description       = "Prometheus metrics"
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port
  cidr_ipv4         = each.value
}

# --- instances ----------------------------------------------------------------------------------------

resource "aws_launch_template" "actor" {
  name_prefix            = "${var.name}-actor-"
  image_id               = var.image
  instance_type          = var.instance_types[0]
  update_default_version = true
  user_data              = base64encode(local.user_data)
  vpc_security_group_ids = [aws_security_group.actor.id]

  iam_instance_profile {
    arn = aws_iam_instance_profile.actor.arn
  }

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

  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = "${var.name}-actor-${var.region}", "aurora:role" = "actor" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(var.tags, { "aurora:role" = "actor" })
  }

  tags = var.tags
}

resource "aws_autoscaling_group" "actor" {
  name                = "${var.name}-actors-${var.region}"
  min_size            = var.desired_count
  max_size            = var.desired_count
  desired_capacity    = var.desired_count
  vpc_zone_identifier = var.subnet_ids
  capacity_rebalance  = true # start a replacement as soon as AWS flags an instance at risk
  health_check_type   = "EC2"

  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = 0
      on_demand_percentage_above_base_capacity = 0 # all spot
      spot_allocation_strategy                 = "price-capacity-optimized"
    }
    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.actor.id
        version            = aws_launch_template.actor.latest_version
      }
      dynamic "override" {
        for_each = var.instance_types
        content {
          instance_type = override.value
        }
      }
    }
  }

  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 50
    }
  }

  tag {
    key                 = "aurora:run"
    value               = var.run
    propagate_at_launch = true
  }
}
