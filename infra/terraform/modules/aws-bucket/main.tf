# One region's bucket of a run. Key layout (aurora_store/store/keys.py), under the run prefix:
#   deltas/<version>.json                  delta manifests        create-only (If-None-Match: *)
#   snapshots/<version>/manifest.json      snapshot manifests     create-only (If-None-Match: *)
#   snapshots/<version>/<file>             snapshot tensors       written once, before the manifest
#   segments/<xx>/<sha256>                 content-addressed segment payloads
#   layouts/<fingerprint>.json             model layouts          create-only (If-None-Match: *)
#   history/<version>.parquet              per-version statistics
#   run.json, latest.json                  run record and newest-version hint (overwritten)
#
# Nothing here ever expires a live object: whether a delta or segment is still needed to reach the
# retained snapshots depends on the version chain, which only `aurora gc` knows. Garbage collection is
# therefore done by `aurora gc` (running as the GC role), never by lifecycle rules. Lifecycle rules only
# abort abandoned multipart uploads and drop noncurrent versions (the leftovers of overwritten pointers
# and of objects `aurora gc` already deleted).

locals {
  bucket_arn = aws_s3_bucket.this.arn

  # Keys that must never be overwritten once published. The bucket may be used with or without the run
  # prefix, so both `deltas/*` and `*/deltas/*` are covered.
  create_only_keys = flatten([
    for pattern in ["deltas/*", "snapshots/*/manifest.json", "layouts/*"] :
    ["${local.bucket_arn}/${pattern}", "${local.bucket_arn}/*/${pattern}"]
  ])

  # Everything a published version is made of: only the GC role may delete it.
  version_data_keys = flatten([
    for pattern in ["deltas/*", "snapshots/*", "segments/*", "layouts/*"] :
    ["${local.bucket_arn}/${pattern}", "${local.bucket_arn}/*/${pattern}"]
  ])
}

resource "aws_s3_bucket" "this" {
  bucket        = var.name
  force_destroy = var.force_destroy
  tags          = merge(var.tags, { "aurora:run" = var.run })
}

resource "aws_s3_bucket_ownership_controls" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "this" {
  bucket                  = aws_s3_bucket.this.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

# Encryption at rest with S3-managed keys (SSE-S3): no KMS grants are needed by actors, relays or the
# trainer, so their IAM policies stay S3-only.
resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  bucket = aws_s3_bucket.this.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_versioning" "this" {
  bucket = aws_s3_bucket.this.id
  versioning_configuration {
    status = var.versioning ? "Enabled" : "Suspended"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  bucket = aws_s3_bucket.this.id

  # Interrupted uploads (a preempted trainer, a relay that died mid-copy) leave invisible parts that are
  # billed until aborted. Completed objects are never touched by this rule.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }

  # With versioning on, overwritten pointers (latest.json, run.json) and objects deleted by `aurora gc`
  # linger as noncurrent versions: drop them after a grace period. Current versions never expire here;
  # the only `expiration` is the removal of delete markers that no longer hide anything.
  dynamic "rule" {
    for_each = var.versioning ? [1] : []
    content {
      id     = "expire-noncurrent-versions"
      status = "Enabled"
      filter {}
      noncurrent_version_expiration {
        noncurrent_days = var.noncurrent_version_days
      }
      expiration {
        expired_object_delete_marker = true
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.this]
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  # Published versions are immutable: a PutObject of a delta manifest, snapshot manifest or layout must
  # carry If-None-Match: * (S3 then answers 412 if the key exists), so nobody, whatever their IAM
  # permissions, can overwrite a published version. The condition key s3:if-none-match is absent (Null)
  # exactly when the header is missing. These objects are small JSON documents written with a single
  # PutObject; multipart uploads (whose CreateMultipartUpload/UploadPart cannot carry the header) are
  # therefore refused for these keys outright, which is intended.
  statement {
    sid       = "DenyOverwriteOfPublishedVersions"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = local.create_only_keys
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Null"
      variable = "s3:if-none-match"
      values   = ["true"]
    }
  }

  # Deleting any part of a version (manifest, snapshot, segment, layout) is reserved to the GC role.
  statement {
    sid       = "DenyDeleteOfVersionDataExceptGC"
    effect    = "Deny"
    actions   = ["s3:DeleteObject", "s3:DeleteObjectVersion"]
    resources = local.version_data_keys
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    dynamic "condition" {
      for_each = length(var.gc_role_arns) > 0 ? [1] : []
      content {
        test     = "ArnNotEquals"
        variable = "aws:PrincipalArn"
        values   = var.gc_role_arns
      }
    }
  }
}

resource "aws_s3_bucket_policy" "this" {
  bucket = aws_s3_bucket.this.id
  policy = data.aws_iam_policy_document.bucket.json

  # S3 rejects concurrent changes to a bucket's policy state: apply the policy after the public access block.
  depends_on = [aws_s3_bucket_public_access_block.this]
}
