output "bucket" {
  description = "Bucket name."
  value       = aws_s3_bucket.this.id
}

output "arn" {
  description = "Bucket ARN."
  value       = aws_s3_bucket.this.arn
}

output "url" {
  description = "Bucket URL for --bucket/--source/--dest: s3://<bucket>/<run>?region=<region>."
  value       = "s3://${var.name}/${var.run}?region=${var.region}"
  # The name is known before apply, so scripts that embed the URL render at plan time.
  depends_on = [aws_s3_bucket.this]
}
