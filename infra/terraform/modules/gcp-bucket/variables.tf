variable "name" {
  description = "Globally unique GCS bucket name."
  type        = string
}

variable "region" {
  description = "Bucket location (a region, next to the actors that read it)."
  type        = string
}

variable "run" {
  description = "Run name: objects live under gs://<bucket>/<run>/ (the bucket URL's prefix)."
  type        = string
}

variable "noncurrent_version_days" {
  description = "Days a noncurrent (overwritten or deleted) object generation is kept."
  type        = number
  default     = 7
}

variable "abort_incomplete_multipart_days" {
  description = "Days after which incomplete multipart uploads are aborted."
  type        = number
  default     = 2
}

variable "kms_key_name" {
  description = "Customer-managed key for encryption at rest; null: Google-managed encryption (always on)."
  type        = string
  default     = null
}

variable "force_destroy" {
  type    = bool
  default = false
}

variable "labels" {
  type    = map(string)
  default = {}
}
