# Inputs of the example (see terraform.tfvars.example); the module documents each in detail.

variable "subscription_id" {
  type        = string
  description = "Azure subscription to deploy into (azurerm 4 requires it explicitly)."
}

variable "name" {
  type        = string
  description = "Prefix of every resource name."
}

variable "location" {
  type        = string
  description = "Azure region with Cobalt 100 VMs (e.g. westeurope, northeurope, eastus2)."
}

variable "zone" {
  type        = string
  description = "Availability zone; on a capacity error try the other zones, then a fall-back size."
  default     = "1"
}

variable "allowed_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to call the gateway (never 0.0.0.0/0)."
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to SSH in (empty = no SSH rule)."
  default     = []
}

variable "key_vault_allowed_ips" {
  type        = list(string)
  description = "Your public IP(s), so that terraform can write the secrets through the Key Vault firewall."
  default     = []
}

variable "admin_ssh_public_key" {
  type        = string
  description = "OpenSSH public key of the admin user."
}

variable "release_url" {
  type        = string
  description = "HTTPS URL of the aarch64 NightShift release tarball."
}

variable "release_sha256" {
  type        = string
  description = "SHA-256 of the release tarball (empty = not checked)."
  default     = ""
}

variable "model_files" {
  type        = list(string)
  description = "GGUF file names on the model disk (first = --model)."
}

variable "model_name" {
  type        = string
  description = "Model id clients pass as `model`."
  default     = "nightshift"
}

variable "model_snapshot_id" {
  type        = string
  description = "Snapshot to restore every model disk from (empty = fill once from model_blob_url)."
  default     = ""
}

variable "model_blob_url" {
  type        = string
  description = "Blob folder URL holding model_files (read with the VMs' managed identity)."
  default     = ""
}

variable "model_storage_scope" {
  type        = string
  description = "Storage account/container id to grant the VMs Storage Blob Data Reader on (empty = none)."
  default     = ""
}

variable "model_disk_size_gb" {
  type        = number
  description = "Model disk size in GiB."
  default     = 1024
}

variable "spot" {
  type        = bool
  description = "Use Spot VMs (evictable, much cheaper)."
  default     = false
}

variable "api_key" {
  type        = string
  description = "Gateway API key (empty = generated); stored in Key Vault."
  default     = ""
  sensitive   = true
}

variable "vm_size" {
  type        = string
  description = "VM size (Cobalt 100). Fall-backs: Standard_E64ps_v6, Standard_D96ps_v6."
  default     = "Standard_E96ps_v6"
}

variable "numa_nodes" {
  type        = number
  description = "NUMA domains of vm_size (one expert node each); check `lscpu | grep NUMA` on the VM."
  default     = 2
}

variable "tls_loopback" {
  type        = bool
  description = "TLS on loopback between the coordinator and the NUMA nodes (default off: the traffic never leaves the VM)."
  default     = false
}
