output "vpc_id" {
  value = aws_vpc.this.id
}

output "cidr" {
  value = var.cidr
}

output "subnet_ids" {
  value = aws_subnet.public[*].id
}

output "route_table_id" {
  value = aws_route_table.public.id
}

output "availability_zones" {
  description = "The zone of each subnet in subnet_ids (same order)."
  value       = aws_subnet.public[*].availability_zone
}
