# Roles that are not tied to one region's instances: the trainer (writes the home bucket) and the GC role
# (the only identity the bucket policies let delete version data). Actor and relay roles live in their
# modules: actors read their regional bucket and the source bucket; relays read the source bucket and
# write their regional bucket. No role of actors, relays or the trainer is granted any s3:Delete*.

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

# --- trainer: its instance (modules/aws-trainer) runs with this instance profile and security group ---------

resource "aws_iam_role" "trainer" {
  name               = "${local.name}-trainer"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "trainer" {
  statement {
    sid       = "ListHomeBucket"
    actions   = ["s3:ListBucket"]
    resources = [module.home_bucket.arn]
  }
  # Writes to create-only keys (deltas/, snapshot manifests, layouts/) additionally need If-None-Match.
  statement {
    sid       = "ReadWriteHomeBucket"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"]
    resources = ["${module.home_bucket.arn}/*"]
  }
  statement {
    sid       = "ReadRedisUrl"
    actions   = ["ssm:GetParameter"]
    resources = [module.redis.url_parameter_arns["trainer"]] # the trainer user's URL, no other role's
  }
  # The signing key, read at every start of the trainer's unit (its value is never in Terraform's state).
  statement {
    sid       = "ReadSigningKey"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [module.trainer.signing_key_secret_arn]
  }
  statement {
    sid       = "ReadAdmissionSecret"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.admission.arn]
  }
}

resource "aws_iam_role_policy" "trainer" {
  name   = "aurora-trainer"
  role   = aws_iam_role.trainer.id
  policy = data.aws_iam_policy_document.trainer.json
}

resource "aws_iam_instance_profile" "trainer" {
  name = aws_iam_role.trainer.name
  role = aws_iam_role.trainer.name
}

resource "aws_security_group" "trainer" {
  name        = "${local.name}-trainer"
  description = "Aurora trainer: outbound only; member of the Redis allow-list"
  vpc_id      = module.home_network.vpc_id
  tags        = { Name = "${local.name}-trainer" }
}

resource "aws_vpc_security_group_egress_rule" "trainer_all" {
  security_group_id = aws_security_group.trainer.id
  description       = "Buckets, Redis, package index, model hub"
  ip_protocol       = "-1"
  cidr_ipv4         = "0.0.0.0/0"
}

# --- garbage collection: `aurora gc` knows the version chain and is the only deleter ---------------------

data "aws_caller_identity" "current" {
  count = length(var.gc_principal_arns) == 0 ? 1 : 0
}

data "aws_iam_policy_document" "gc_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "AWS"
      identifiers = length(var.gc_principal_arns) > 0 ? var.gc_principal_arns : ["arn:aws:iam::${data.aws_caller_identity.current[0].account_id}:root"]
    }
  }
}

resource "aws_iam_role" "gc" {
  name               = "${local.name}-gc"
  description        = "aurora gc: deletes deltas, snapshots and segments no retained snapshot needs"
  assume_role_policy = data.aws_iam_policy_document.gc_assume.json
}

data "aws_iam_policy_document" "gc" {
  statement {
    sid       = "ListBuckets"
    actions   = ["s3:ListBucket"]
    resources = local.bucket_arns
  }
  statement {
    sid       = "ReadAndDeleteVersionData"
    actions   = ["s3:GetObject", "s3:DeleteObject"]
    resources = [for arn in local.bucket_arns : "${arn}/*"]
  }
}

resource "aws_iam_role_policy" "gc" {
  name   = "aurora-gc"
  role   = aws_iam_role.gc.id
  policy = data.aws_iam_policy_document.gc.json
}
