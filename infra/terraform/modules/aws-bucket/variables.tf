variable "name" {
  description = "Globally unique S3 bucket name."
  type        = string
}

variable "region" {
  description = "Region the bucket lives in (the provider passed to this module must be configured for it)."
  type        = string
}

variable "run" {
  description = "Run name: objects live under s3://<bucket>/<run>/ (the bucket URL's prefix)."
  type        = string
}

variable "gc_role_arns" {
  description = "IAM role ARNs that may delete version data (deltas/, snapshots/, segments/, layouts/): the role `aurora gc` runs as. Empty: nobody may."
  type        = list(string)
  default     = []
}

variable "versioning" {
  description = "Keep object versioning on: an accidental delete or overwrite leaves a recoverable noncurrent version for noncurrent_version_days."
  type        = bool
  default     = true
}

variable "noncurrent_version_days" {
  description = "Days a noncurrent (overwritten or deleted) object version is kept before S3 removes it."
  type        = number
  default     = 7
}

variable "abort_incomplete_multipart_days" {
  description = "Days after which S3 aborts multipart uploads that were never completed."
  type        = number
  default     = 2
}

variable "force_destroy" {
  description = "Allow `terraform destroy` to delete a bucket that still holds objects."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Extra tags for the bucket."
  type        = map(string)
  default     = {}
}
