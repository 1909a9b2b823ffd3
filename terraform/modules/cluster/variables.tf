# Inputs of the NightShift cluster module. Defaults target Azure Cobalt 100 (Arm, Neoverse N2).

variable "name" {
  type        = string
  description = "Prefix of every resource name (lower-case letters, digits and dashes, 3-16 characters)."
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,15}$", var.name))
    error_message = "The name must be 3-16 characters of lower-case letters, digits and dashes, starting with a letter."
  }
}

variable "location" {
  type        = string
  description = "Azure region with Cobalt 100 VMs (Dpsv6/Epsv6), e.g. westeurope, northeurope, eastus2. Fall-back: if a region runs dry, change this and zone; nothing else depends on the region."
}

variable "zone" {
  type        = string
  description = "Availability zone for every VM and disk (\"1\", \"2\" or \"3\"). Premium SSD v2 needs a zone. Fall-back when a zone has no capacity for the size: try the other zones first, then another size from vm_size_fallbacks."
  default     = "1"
}

variable "layout" {
  type        = string
  description = "\"single-vm\": one VM, one expert node per NUMA domain (systemd nightshift-expert-node@N) and the coordinator on the same VM. \"multi-vm\": one coordinator VM and node_count expert-node VMs."
  default     = "single-vm"
  validation {
    condition     = contains(["single-vm", "multi-vm"], var.layout)
    error_message = "The layout must be \"single-vm\" or \"multi-vm\"."
  }
}

variable "single_vm_size" {
  type        = string
  description = "VM size of the single-VM layout. Default: Standard_E96ps_v6 (Cobalt 100, 96 vCPU, 672 GiB). Fall-backs in order: Standard_E64ps_v6, Standard_D96ps_v6 (384 GiB), then another region."
  default     = "Standard_E96ps_v6"
}

variable "numa_nodes" {
  type        = number
  description = "NUMA domains of the single-VM size: one expert node per domain (check with `lscpu | grep NUMA` on the VM; at most 10 because node i listens on port <node_port_prefix>i)."
  default     = 2
  validation {
    condition     = var.numa_nodes >= 1 && var.numa_nodes <= 10
    error_message = "The numa_nodes must be between 1 and 10."
  }
}

variable "node_port_prefix" {
  type        = string
  description = "Single-VM layout: expert node i listens on 127.0.0.1:<prefix>i (default 5005 -> 50050, 50051, ...)."
  default     = "5005"
  validation {
    condition     = can(regex("^[1-9][0-9]{3}$", var.node_port_prefix)) && tonumber(var.node_port_prefix) <= 6552
    error_message = "The node_port_prefix must be four digits from 1000 to 6552 so that <prefix>9 is a valid port."
  }
}

variable "coordinator_vm_size" {
  type        = string
  description = "Multi-VM layout: coordinator VM size (attention, shared experts, KV cache). Default Standard_E16ps_v6; fall-backs: Standard_D16ps_v6, Standard_E8ps_v6."
  default     = "Standard_E16ps_v6"
}

variable "node_vm_size" {
  type        = string
  description = "Multi-VM layout: expert-node VM size. Default Standard_E16ps_v6 (16 vCPU, 128 GiB); fall-backs: Standard_E32ps_v6 (fewer nodes), Standard_D16ps_v6 (64 GiB, more nodes)."
  default     = "Standard_E16ps_v6"
}

variable "vm_size_fallbacks" {
  type        = list(string)
  description = "Documentation of the sizes to try, in order, when the chosen size has no capacity (not used automatically: set single_vm_size/node_vm_size to one of them and apply again)."
  default     = ["Standard_E64ps_v6", "Standard_D96ps_v6", "Standard_E32ps_v6", "Standard_D16ps_v6"]
}

variable "node_count" {
  type        = number
  description = "Multi-VM layout: number of expert-node VMs."
  default     = 4
  validation {
    condition     = var.node_count >= 1 && var.node_count <= 64
    error_message = "The node_count must be between 1 and 64."
  }
}

variable "node_port" {
  type        = number
  description = "Multi-VM layout: gRPC port of every expert node; its data link listens on the next port (both admitted only from inside the subnet)."
  default     = 50051
}

variable "node_memory_bytes" {
  type        = number
  description = "memory_bytes written for every node in the placement: capacity for resident expert weights (0 = unlimited)."
  default     = 0
}

variable "node_threads" {
  type        = number
  description = "Worker threads per expert node (0 = the binary's default: the cores of its NUMA domain or VM)."
  default     = 0
}

variable "coordinator_threads" {
  type        = number
  description = "Coordinator compute threads (0 = the binary's default: all cores)."
  default     = 0
}

variable "gateway_port" {
  type        = number
  description = "Port of the OpenAI-compatible gateway."
  default     = 8080
}

variable "allowed_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to reach the gateway port. Must be non-empty and must not contain 0.0.0.0/0."
  validation {
    condition     = length(var.allowed_cidrs) > 0 && !contains(var.allowed_cidrs, "0.0.0.0/0") && !contains(var.allowed_cidrs, "*")
    error_message = "The allowed_cidrs must list at least one CIDR and must not open the gateway to the world (0.0.0.0/0 or *)."
  }
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to SSH into the VMs; empty (the default) = no SSH rule at all (use Azure Bastion or serial console)."
  default     = []
  validation {
    condition     = !contains(var.ssh_allowed_cidrs, "0.0.0.0/0") && !contains(var.ssh_allowed_cidrs, "*")
    error_message = "The ssh_allowed_cidrs must not open SSH to the world (0.0.0.0/0 or *)."
  }
}

variable "public_gateway" {
  type        = bool
  description = "Give the coordinator a static public IP (still restricted to allowed_cidrs by the NSG). false = private IP only (VPN/peering)."
  default     = true
}

variable "admin_username" {
  type        = string
  description = "Admin user of the VMs (SSH key only; passwords are disabled)."
  default     = "azureuser"
}

variable "admin_ssh_public_key" {
  type        = string
  description = "OpenSSH public key of the admin user (needed even without SSH access: Azure requires a key when passwords are disabled)."
}

variable "address_space" {
  type        = string
  description = "Address space of the VNet."
  default     = "10.42.0.0/16"
}

variable "subnet_prefix" {
  type        = string
  description = "Subnet of the cluster; the coordinator gets host 4 and node i gets host 10+i (static private IPs)."
  default     = "10.42.1.0/24"
}

variable "release_url" {
  type        = string
  description = "HTTPS URL of the aarch64 release tarball holding nightshift, nightshift-expert-node and nightshift-atlas (built with RUSTFLAGS=\"-C target-cpu=neoverse-n2\" for Cobalt 100)."
}

variable "release_sha256" {
  type        = string
  description = "SHA-256 of the release tarball (checked before install; empty = not checked)."
  default     = ""
}

variable "model_files" {
  type        = list(string)
  description = "GGUF file names on the model disk; the first one is passed to --model (split models: list every split)."
  validation {
    condition     = length(var.model_files) > 0
    error_message = "The model_files must name at least one GGUF file."
  }
}

variable "model_name" {
  type        = string
  description = "Model id clients pass as `model` in OpenAI requests."
  default     = "nightshift"
}

variable "model_snapshot_id" {
  type        = string
  description = "Resource id of a (incremental) snapshot of a disk holding the model files; every model disk is restored from it. Empty = empty disks filled once from model_blob_url."
  default     = ""
}

variable "model_blob_url" {
  type        = string
  description = "HTTPS URL of the blob container folder holding model_files (read with the managed identity, which needs Storage Blob Data Reader on model_storage_scope). Used only when the disk lacks the files."
  default     = ""
}

variable "model_storage_scope" {
  type        = string
  description = "Resource id (storage account or container) on which the VMs' identity gets Storage Blob Data Reader; empty = no role assignment (grant it yourself or use a snapshot)."
  default     = ""
}

variable "model_disk_size_gb" {
  type        = number
  description = "Size of each model disk in GiB (Kimi K2 Q4_K_M is about 620 GB; restoring a snapshot needs at least its size)."
  default     = 1024
}

variable "model_disk_sku" {
  type        = string
  description = "Storage type of the model disks: PremiumV2_LRS (default; needs a zone) or, as fall-back where v2 is unavailable, Premium_LRS."
  default     = "PremiumV2_LRS"
  validation {
    condition     = contains(["PremiumV2_LRS", "Premium_LRS", "Premium_ZRS"], var.model_disk_sku)
    error_message = "The model_disk_sku must be PremiumV2_LRS, Premium_LRS or Premium_ZRS."
  }
}

variable "model_disk_iops" {
  type        = number
  description = "Provisioned IOPS of each Premium SSD v2 model disk (3000 are free)."
  default     = 12000
}

variable "model_disk_mbps" {
  type        = number
  description = "Provisioned throughput (MB/s) of each Premium SSD v2 model disk (125 are free; loading experts is sequential reads)."
  default     = 750
}

variable "os_disk_size_gb" {
  type        = number
  description = "OS disk size in GiB."
  default     = 64
}

variable "spot" {
  type        = bool
  description = "Run the VMs as Spot (much cheaper, can be evicted at any time)."
  default     = false
}

variable "spot_eviction_policy" {
  type        = string
  description = "What Azure does to an evicted Spot VM: Deallocate (keeps disks, restart later) or Delete."
  default     = "Deallocate"
  validation {
    condition     = contains(["Deallocate", "Delete"], var.spot_eviction_policy)
    error_message = "The spot_eviction_policy must be Deallocate or Delete."
  }
}

variable "spot_max_price" {
  type        = number
  description = "Highest hourly price (USD) paid for a Spot VM; -1 = up to the on-demand price (never evicted for price)."
  default     = -1
}

variable "proximity_placement_group" {
  type        = bool
  description = "Put every VM in one proximity placement group (lowest latency between coordinator and nodes). Set false if allocation fails for lack of capacity."
  default     = true
}

variable "encryption_at_host" {
  type        = bool
  description = "Encrypt temp disks and caches at the host (needs the EncryptionAtHost feature registered on the subscription)."
  default     = true
}

variable "api_key" {
  type        = string
  description = "API key clients must present (Bearer). Empty = a random 48-character key is generated. Stored only in Key Vault and the state; read it with `terraform output -raw api_key`."
  default     = ""
  sensitive   = true
}

variable "key_vault_allowed_ips" {
  type        = list(string)
  description = "Public IPs/CIDRs (yours, or your CI runner's) allowed through the Key Vault firewall so that terraform can write the secrets; the VMs reach it through the subnet's service endpoint."
  default     = []
}

variable "secret_expiry" {
  type        = string
  description = "RFC 3339 expiry date of the Key Vault secrets (rotate before then)."
  default     = "2027-12-31T00:00:00Z"
}

variable "tls_enabled" {
  type        = bool
  description = "TLS on the gRPC traffic between the coordinator and the expert nodes (rustls; certificates from a per-deployment CA, or yours: tls_ca_cert_pem). On by default for the multi-VM layout; the single-VM layout's loopback uses it only with tls_loopback. false = plaintext gRPC (the shared node token still authenticates the coordinator)."
  default     = true
}

variable "tls_mutual" {
  type        = bool
  description = "With TLS: mutual TLS, i.e. every expert node also requires the coordinator's client certificate signed by the cluster CA (--tls-client-ca). false = the nodes present certificates, the coordinator is authenticated by the shared token only."
  default     = true
}

variable "tls_loopback" {
  type        = bool
  description = "Single-VM layout: TLS on loopback too (needs tls_enabled). Off by default: the traffic never leaves the VM, and whoever could read it there could read the keys too."
  default     = false
}

variable "tls_ca_cert_pem" {
  type        = string
  description = "Your own CA certificate (PEM) to sign the node and coordinator certificates with; empty (default) = a CA generated per deployment (ECDSA P-256, kept in the state). Give tls_ca_private_key_pem with it."
  default     = ""
  validation {
    condition     = var.tls_ca_cert_pem == "" || can(regex("-----BEGIN CERTIFICATE-----", var.tls_ca_cert_pem))
    error_message = "The tls_ca_cert_pem must be empty or a PEM certificate (-----BEGIN CERTIFICATE-----)."
  }
}

variable "tls_ca_private_key_pem" {
  type        = string
  description = "Private key (PEM) of tls_ca_cert_pem; empty with an empty tls_ca_cert_pem. It ends up in the state (see README: protect the state)."
  default     = ""
  sensitive   = true
  validation {
    condition     = var.tls_ca_private_key_pem == "" || can(regex("-----BEGIN [A-Z ]*PRIVATE KEY-----", var.tls_ca_private_key_pem))
    error_message = "The tls_ca_private_key_pem must be empty or a PEM private key (-----BEGIN ... PRIVATE KEY-----)."
  }
}

variable "tls_ca_validity_hours" {
  type        = number
  description = "Validity of the generated CA certificate in hours (default 10 years); ignored with your own CA."
  default     = 87600
}

variable "tls_cert_validity_hours" {
  type        = number
  description = "Validity of the node and coordinator certificates in hours (default 1 year)."
  default     = 8760
}

variable "tls_cert_early_renewal_hours" {
  type        = number
  description = "A terraform apply this many hours (or fewer) before a certificate expires issues a new one (default 30 days); then restart nightshift-prepare and the units (README)."
  default     = 720
}

variable "expert_deadline_ms" {
  type        = number
  description = "Coordinator: deadline of one layer call on one node in milliseconds, then retried on another replica."
  default     = 10000
}

variable "max_seqs" {
  type        = number
  description = "Coordinator: sequences decoded together at most (continuous batching)."
  default     = 8
}

variable "ctx" {
  type        = number
  description = "Coordinator: context length per sequence (prompt + completion)."
  default     = 4096
}

variable "record_atlas" {
  type        = bool
  description = "Coordinator: record the expert activation atlas to /var/lib/nightshift/atlas.bin (--atlas-out), the input of `nightshift-atlas plan`. Off by default: the coordinator build of this date rejects --atlas-out until its recorder lands."
  default     = false
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
