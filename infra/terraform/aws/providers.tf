# One provider per region. Terraform cannot create providers in a loop, so the root has a fixed number of
# remote-region slots (remote1..remote3). A slot whose region is not listed in var.remote_regions points
# at the home region and its module has count = 0, so it creates nothing. Add a slot (provider + module
# block in main.tf + the validation's limit) to support more remote regions.

provider "aws" {
  region = var.home_region
  default_tags {
    tags = local.tags
  }
}

provider "aws" {
  alias  = "remote1"
  region = local.remote_slots[0]
  default_tags {
    tags = local.tags
  }
}

provider "aws" {
  alias  = "remote2"
  region = local.remote_slots[1]
  default_tags {
    tags = local.tags
  }
}

provider "aws" {
  alias  = "remote3"
  region = local.remote_slots[2]
  default_tags {
    tags = local.tags
  }
}
