output "network_id" {
  value = google_compute_network.this.id
}

output "subnetwork_ids" {
  description = "Region => subnetwork id."
  value       = { for region, subnet in google_compute_subnetwork.region : region => subnet.id }
}
