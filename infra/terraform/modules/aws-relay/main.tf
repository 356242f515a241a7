# The relay of one remote region: a single small on-demand instance (an auto-scaling group of one, so a
# failed instance is replaced) running `python -m workers.relay`, which copies each new version from the
# trainer's home bucket into this region's bucket and re-announces it on the region's event stream.

locals {
  user_data = templatefile("${path.module}/templates/relay-user-data.sh.tftpl", {
    run                    = var.run
    region                 = var.region
    source_bucket_url      = var.source_bucket_url
    bucket_url             = var.bucket_url
    redis_parameter_name   = var.redis_parameter_name
    redis_parameter_region = var.redis_parameter_region
    cache_token_parameter  = var.cache_token_parameter
    cache_port             = var.cache_port
    pip_requirements       = var.pip_requirements
    pip_extra_args         = var.pip_extra_args
    trainer_public_key     = var.trainer_public_key
    metrics_port           = var.metrics_port == null ? "" : tostring(var.metrics_port)
    model_url              = var.model_url
    stop_timeout_s         = var.stop_timeout_s
  })
}

# --- identity: read the source bucket, read and write (never delete) the regional bucket ----------------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "relay" {
  name               = "${var.name}-relay-${var.region}"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "relay" {
  statement {
    sid       = "ListBuckets"
    actions   = ["s3:ListBucket"]
    resources = [var.source_bucket_arn, var.bucket_arn]
  }
  statement {
    sid       = "ReadSourceAndRegional"
    actions   = ["s3:GetObject"]
    resources = ["${var.source_bucket_arn}/*", "${var.bucket_arn}/*"]
  }
  # Create-only keys (deltas/, snapshot manifests, layouts/) additionally need If-None-Match (bucket policy).
  statement {
    sid       = "WriteRegional"
    actions   = ["s3:PutObject", "s3:AbortMultipartUpload"]
    resources = ["${var.bucket_arn}/*"]
  }
  statement {
    sid       = "ReadRedisUrl"
    actions   = ["ssm:GetParameter"]
    resources = [var.redis_parameter_arn] # the relay user's URL, no other role's
  }
  statement {
    sid       = "ReadCacheToken"
    actions   = ["ssm:GetParameter"]
    resources = [var.cache_token_arn]
  }
}

resource "aws_iam_role_policy" "relay" {
  name   = "aurora-relay"
  role   = aws_iam_role.relay.id
  policy = data.aws_iam_policy_document.relay.json
}

resource "aws_iam_instance_profile" "relay" {
  name = aws_iam_role.relay.name
  role = aws_iam_role.relay.name
  tags = var.tags
}

# --- network --------------------------------------------------------------------------------------------

resource "aws_security_group" "relay" {
  name        = "${var.name}-relay"
  description = "Aurora relay: outbound, its segment cache to its region's VPC (plus metrics scraping when enabled)"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-relay" })
}

resource "aws_vpc_security_group_egress_rule" "relay_all" {
  security_group_id = aws_security_group.relay.id
  description       = "Buckets, Redis, package index"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

# The hot segment cache (bearer token required) is served to the region's actors only: the VPC's own CIDR.
resource "aws_vpc_security_group_ingress_rule" "relay_cache" {
  security_group_id = aws_security_group.relay.id
  description       = "Segment cache for the region's actors"
  ip_protocol       = "tcp"
  from_port         = var.cache_port
  to_port           = var.cache_port
  cidr_ipv4         = var.vpc_cidr
}

resource "aws_vpc_security_group_ingress_rule" "relay_metrics" {
  for_each          = var.metrics_port == null ? toset([]) : toset(var.metrics_cidrs)
  security_group_id = aws_security_group.relay.id
  description       = "Prometheus metrics"
  ip_protocol       = "tcp"
  from_port         = var.metrics_port
  to_port           = var.metrics_port
  cidr_ipv4         = each.value
}

# --- instance ---------------------------------------------------------------------------------------------

resource "aws_launch_template" "relay" {
  name_prefix            = "${var.name}-relay-"
  image_id               = var.image
  instance_type          = var.instance_type
  update_default_version = true
  user_data              = base64encode(local.user_data)
  vpc_security_group_ids = [aws_security_group.relay.id]

  iam_instance_profile {
    arn = aws_iam_instance_profile.relay.arn
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
    tags          = merge(var.tags, { Name = "${var.name}-relay-${var.region}", "aurora:role" = "relay" })
  }

  tags = var.tags
}

resource "aws_autoscaling_group" "relay" {
  name                = "${var.name}-relay-${var.region}"
  min_size            = 1
  max_size            = 1
  desired_capacity    = 1
  vpc_zone_identifier = var.subnet_ids
  health_check_type   = "EC2"

  launch_template {
    id      = aws_launch_template.relay.id
    version = aws_launch_template.relay.latest_version
  }

  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 0
    }
  }

  tag {
    key                 = "aurora:run"
    value               = var.run
    propagate_at_launch = true
  }
}
