# NightShift example: A coordinator VM plus node_count Standard_E16ps_v6 (Cobalt 100) expert-node VMs in one subnet and proximity placement group.
# Copy terraform.tfvars.example to terraform.tfvars, edit it, then terraform init && terraform apply.

terraform {
  required_version = ">= 1.5.0"
  required_providers {
    azurerm = {
      source  = "hashicorp/azurerm"
      version = ">= 4.0.0, < 5.0.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.5.0"
    }
    tls = {
      source  = "hashicorp/tls"
      version = ">= 4.0.0"
    }
  }
}

provider "azurerm" {
  subscription_id = var.subscription_id
  features {
    key_vault {
      purge_soft_delete_on_destroy = false
    }
  }
}

module "cluster" {
  source = "../../modules/cluster"

  name                   = var.name
  location               = var.location
  zone                   = var.zone
  layout                 = "multi-vm"
  coordinator_vm_size    = var.coordinator_vm_size
  node_vm_size           = var.node_vm_size
  node_count             = var.node_count
  allowed_cidrs          = var.allowed_cidrs
  ssh_allowed_cidrs      = var.ssh_allowed_cidrs
  key_vault_allowed_ips  = var.key_vault_allowed_ips
  admin_ssh_public_key   = var.admin_ssh_public_key
  release_url            = var.release_url
  release_sha256         = var.release_sha256
  model_files            = var.model_files
  model_name             = var.model_name
  model_snapshot_id      = var.model_snapshot_id
  model_blob_url         = var.model_blob_url
  model_storage_scope    = var.model_storage_scope
  model_disk_size_gb     = var.model_disk_size_gb
  spot                   = var.spot
  api_key                = var.api_key
  tls_enabled            = var.tls_enabled
  tls_mutual             = var.tls_mutual
  tls_ca_cert_pem        = var.tls_ca_cert_pem
  tls_ca_private_key_pem = var.tls_ca_private_key_pem
  tags                   = { project = "nightshift", example = var.name }
}
