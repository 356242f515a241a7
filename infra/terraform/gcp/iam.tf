# Service accounts not tied to one region's instances: the trainer (writes the home bucket) and GC (the
# only identity that may delete version data). Actor and relay accounts live in their modules: actors hold
# roles/storage.objectViewer on their regional bucket and the source bucket; relays objectViewer on both
# plus objectCreator on their regional bucket. objectCreator cannot overwrite or delete, so published
# deltas and manifests are immutable; see modules/gcp-bucket for the narrow rewrite grant.

resource "google_service_account" "trainer" {
  account_id   = "${substr(local.name, 0, 14)}-trainer"
  display_name = "Aurora trainer ${var.run}"
  depends_on   = [google_project_service.apis]
}

resource "google_storage_bucket_iam_member" "trainer_read" {
  bucket = local.home_bucket.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.trainer.member
}

resource "google_storage_bucket_iam_member" "trainer_create" {
  bucket = local.home_bucket.name
  role   = "roles/storage.objectCreator"
  member = google_service_account.trainer.member
}

resource "google_storage_bucket_iam_member" "trainer_rewrite" {
  bucket = local.home_bucket.name
  role   = "roles/storage.objectUser"
  member = google_service_account.trainer.member
  condition {
    title       = "aurora-rewritable-objects"
    description = "Pointers and content-addressed objects; never deltas/, layouts/ or snapshot manifests"
    expression  = local.home_bucket.rewritable_objects_condition
  }
}

resource "google_secret_manager_secret_iam_member" "trainer_redis_url" {
  secret_id = module.redis.secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.trainer.member
}

resource "google_secret_manager_secret_iam_member" "trainer_admission" {
  secret_id = google_secret_manager_secret.admission.id
  role      = "roles/secretmanager.secretAccessor"
  member    = google_service_account.trainer.member
}

# --- garbage collection --------------------------------------------------------------------------------------

resource "google_service_account" "gc" {
  account_id   = "${substr(local.name, 0, 14)}-gc"
  display_name = "Aurora gc ${var.run}: deletes what no retained snapshot needs"
  depends_on   = [google_project_service.apis]
}

resource "google_storage_bucket_iam_member" "gc" {
  for_each = module.bucket
  bucket   = each.value.name
  role     = "roles/storage.objectUser"
  member   = google_service_account.gc.member
}

resource "google_service_account_iam_member" "gc_impersonation" {
  for_each           = toset(var.gc_members)
  service_account_id = google_service_account.gc.name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = each.value
}
