output "name" {
  value = google_storage_bucket.this.name
}

output "url" {
  description = "Bucket URL for --bucket/--source/--dest: gs://<bucket>/<run>."
  value       = "gs://${var.name}/${var.run}"
  depends_on  = [google_storage_bucket.this]
}

output "rewritable_objects_condition" {
  description = "IAM condition (CEL) matching the objects writers may overwrite: everything but deltas/, layouts/ and snapshot manifests."
  value = join(" || ", [
    "resource.name == \"${local.objects}/run.json\"",
    "resource.name == \"${local.objects}/latest.json\"",
    "resource.name.startsWith(\"${local.objects}/segments/\")",
    "resource.name.startsWith(\"${local.objects}/history/\")",
    "(resource.name.startsWith(\"${local.objects}/snapshots/\") && !resource.name.endsWith(\"/manifest.json\"))",
  ])
}
