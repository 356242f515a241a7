# One region's bucket of a run (key layout: aurora_store/store/keys.py, under the run prefix).
#
# Nothing here ever deletes a live object: whether a delta or segment is still needed to reach the
# retained snapshots depends on the version chain, which only `aurora gc` knows, so garbage collection is
# done by `aurora gc` (as the GC service account). Lifecycle rules only abort abandoned multipart uploads
# and delete noncurrent generations (overwritten pointers, objects `aurora gc` already deleted).
#
# Immutability of published versions comes from IAM: writers hold roles/storage.objectCreator, which
# creates objects but can neither overwrite nor delete them, so delta manifests, snapshot manifests and
# layouts (created with ifGenerationMatch=0) can never be replaced. The keys the code legitimately
# rewrites (run.json, latest.json, and idempotent re-uploads of content-addressed segments, snapshot
# tensors and history rows) are covered by a conditional roles/storage.objectUser grant limited to
# exactly those names (output `rewritable_objects_condition`); deltas/, layouts/ and manifests are
# outside it. Versioning keeps anything rewritten recoverable for noncurrent_version_days.

locals {
  objects = "projects/_/buckets/${var.name}/objects/${var.run}"
}

resource "google_storage_bucket" "this" {
  name                        = var.name
  location                    = var.region
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true # IAM only (needed for the conditional grants), no ACLs
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy
  labels                      = merge(var.labels, { aurora-run = var.run })

  versioning {
    enabled = true
  }

  # Encryption at rest is always on (Google-managed keys); optionally with a customer-managed key.
  dynamic "encryption" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      default_kms_key_name = encryption.value
    }
  }

  lifecycle_rule {
    action {
      type = "AbortIncompleteMultipartUpload"
    }
    condition {
      age = var.abort_incomplete_multipart_days
    }
  }

  # Only noncurrent generations: live objects never expire.
  lifecycle_rule {
    action {
      type = "Delete"
    }
    condition {
      with_state                 = "ARCHIVED"
      days_since_noncurrent_time = var.noncurrent_version_days
    }
  }
}
