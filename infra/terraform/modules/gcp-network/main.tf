# One global VPC for the run with a subnet per region. Instances have no external addresses: Cloud NAT
# gives them egress (package index, model hub) and Private Google Access reaches GCS and Secret Manager.
# No ingress is allowed (GCP's implied deny) except an optional metrics port. Memorystore is reachable
# from every region of this network, and from no other network (authorized_network).

resource "google_compute_network" "this" {
  name                    = var.name
  auto_create_subnetworks = false
}

resource "google_compute_subnetwork" "region" {
  for_each                 = var.subnets
  name                     = "${var.name}-${each.key}"
  region                   = each.key
  network                  = google_compute_network.this.id
  ip_cidr_range            = each.value
  private_ip_google_access = true
}

resource "google_compute_router" "region" {
  for_each = var.subnets
  name     = "${var.name}-${each.key}"
  region   = each.key
  network  = google_compute_network.this.id
}

resource "google_compute_router_nat" "region" {
  for_each                           = var.subnets
  name                               = "${var.name}-${each.key}"
  region                             = each.key
  router                             = google_compute_router.region[each.key].name
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
}

resource "google_compute_firewall" "metrics" {
  count         = var.metrics_port == null || length(var.metrics_cidrs) == 0 ? 0 : 1
  name          = "${var.name}-metrics"
  network       = google_compute_network.this.id
  direction     = "INGRESS"
  source_ranges = var.metrics_cidrs
  target_tags   = ["aurora-metrics"]
  allow {
    protocol = "tcp"
    ports    = [tostring(var.metrics_port)]
  }
}
