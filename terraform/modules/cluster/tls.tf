# TLS between the coordinator and the expert nodes (hashicorp/tls): a per-deployment CA (or the
# one you bring), one server certificate per VM that runs expert nodes (its private IP and names
# as SANs: the coordinator checks each node against the host of its placement `addr`), and one
# client certificate for the coordinator (mutual TLS). Every VM's PEMs go to Key Vault as one JSON
# secret (nightshift-tls-<vm>); nightshift-prepare.service writes them under /etc/nightshift/tls
# at boot, so no private key is in custom_data and re-issued certificates replace no VM.
#
# Default: mutual TLS on the multi-VM layout; the single-VM layout's loopback stays plaintext
# unless tls_loopback is set (the traffic never leaves the VM; see README).

locals {
  tls_on     = var.tls_enabled && (!local.single || var.tls_loopback)
  tls_mutual = local.tls_on && var.tls_mutual
  tls_own_ca = var.tls_ca_cert_pem == ""

  tls_dir              = "/etc/nightshift/tls"
  tls_ca_path          = "${local.tls_dir}/ca.pem"
  tls_node_cert_path   = "${local.tls_dir}/node.pem"
  tls_node_key_path    = "${local.tls_dir}/node-key.pem"
  tls_client_cert_path = "${local.tls_dir}/coordinator.pem"
  tls_client_key_path  = "${local.tls_dir}/coordinator-key.pem"

  # VMs that run expert nodes (every node VM, or the single VM) and the names their certificate
  # carries: the private IP (multi-VM) or loopback (single-VM), the VM's host name, and the
  # placement names of the nodes it serves.
  tls_node_vms = { for k, vm in local.vms : k => {
    ip_addresses = local.single ? ["127.0.0.1"] : [vm.ip]
    dns_names = distinct(concat(
      ["${var.name}-${k}"],
      local.single ? ["localhost"] : [],
      [for n in local.cluster_nodes : n.name if local.single || n.name == vm.node_name],
    ))
  } if local.tls_on && (local.single || !vm.coordinator) }

  tls_ca_cert_pem = !local.tls_on ? "" : local.tls_own_ca ? tls_self_signed_cert.ca[0].cert_pem : var.tls_ca_cert_pem
  tls_ca_key_pem  = !local.tls_on ? "" : local.tls_own_ca ? tls_private_key.ca[0].private_key_pem : var.tls_ca_private_key_pem

  # What nightshift-prepare writes on each VM: field of the JSON secret -> file, mode. Keys 0600,
  # certificates 0644, all owned by the service user. The CA goes where it is used: to the
  # coordinator (it checks the nodes) and, with mutual TLS, to the nodes (they check the coordinator).
  tls_files = { for k, vm in local.vms : k => concat(
    local.tls_on && (vm.coordinator || local.tls_mutual) ? [{ field = "ca", path = local.tls_ca_path, mode = "0644" }] : [],
    contains(keys(local.tls_node_vms), k) ? [
      { field = "node_cert", path = local.tls_node_cert_path, mode = "0644" },
      { field = "node_key", path = local.tls_node_key_path, mode = "0600" },
    ] : [],
    local.tls_mutual && vm.coordinator ? [
      { field = "client_cert", path = local.tls_client_cert_path, mode = "0644" },
      { field = "client_key", path = local.tls_client_key_path, mode = "0600" },
    ] : [],
  ) }
}

resource "tls_private_key" "ca" {
  count       = local.tls_on && local.tls_own_ca ? 1 : 0
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "ca" {
  count                 = local.tls_on && local.tls_own_ca ? 1 : 0
  private_key_pem       = tls_private_key.ca[0].private_key_pem
  is_ca_certificate     = true
  validity_period_hours = var.tls_ca_validity_hours
  allowed_uses          = ["cert_signing", "crl_signing", "digital_signature"]

  subject {
    common_name  = "${var.name} NightShift cluster CA"
    organization = "NightShift"
  }
}

resource "tls_private_key" "node" {
  for_each    = local.tls_node_vms
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "node" {
  for_each        = local.tls_node_vms
  private_key_pem = tls_private_key.node[each.key].private_key_pem
  dns_names       = each.value.dns_names
  ip_addresses    = each.value.ip_addresses

  subject {
    common_name  = "${var.name}-${each.key}"
    organization = "NightShift"
  }
}

resource "tls_locally_signed_cert" "node" {
  for_each              = local.tls_node_vms
  cert_request_pem      = tls_cert_request.node[each.key].cert_request_pem
  ca_private_key_pem    = local.tls_ca_key_pem
  ca_cert_pem           = local.tls_ca_cert_pem
  validity_period_hours = var.tls_cert_validity_hours
  early_renewal_hours   = var.tls_cert_early_renewal_hours
  allowed_uses          = ["digital_signature", "key_encipherment", "server_auth"]

  lifecycle {
    precondition {
      condition     = (var.tls_ca_cert_pem == "") == (var.tls_ca_private_key_pem == "")
      error_message = "Expected both tls_ca_cert_pem and tls_ca_private_key_pem (your own CA) or neither (a CA generated per deployment), found only one."
    }
  }
}

resource "tls_private_key" "coordinator" {
  count       = local.tls_mutual ? 1 : 0
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "coordinator" {
  count           = local.tls_mutual ? 1 : 0
  private_key_pem = tls_private_key.coordinator[0].private_key_pem
  dns_names       = ["${var.name}-${local.single ? "main" : "coord"}"]
  ip_addresses    = [local.coordinator_ip]

  subject {
    common_name  = "${var.name} NightShift coordinator"
    organization = "NightShift"
  }
}

resource "tls_locally_signed_cert" "coordinator" {
  count                 = local.tls_mutual ? 1 : 0
  cert_request_pem      = tls_cert_request.coordinator[0].cert_request_pem
  ca_private_key_pem    = local.tls_ca_key_pem
  ca_cert_pem           = local.tls_ca_cert_pem
  validity_period_hours = var.tls_cert_validity_hours
  early_renewal_hours   = var.tls_cert_early_renewal_hours
  allowed_uses          = ["digital_signature", "client_auth"]
}

# One secret per VM holding exactly the PEMs that VM needs (empty strings for the others); keys in
# PKCS#8, the form the binaries read.
resource "azurerm_key_vault_secret" "tls" {
  for_each     = { for k, vm in local.vms : k => vm if local.tls_on }
  name         = "nightshift-tls-${each.key}"
  key_vault_id = azurerm_key_vault.this.id
  content_type = "application/json; NightShift TLS PEMs of VM ${each.key} (ca, node_cert/node_key, client_cert/client_key)"
  value = jsonencode({
    ca          = local.tls_ca_cert_pem
    node_cert   = contains(keys(local.tls_node_vms), each.key) ? tls_locally_signed_cert.node[each.key].cert_pem : ""
    node_key    = contains(keys(local.tls_node_vms), each.key) ? tls_private_key.node[each.key].private_key_pem_pkcs8 : ""
    client_cert = local.tls_mutual && each.value.coordinator ? tls_locally_signed_cert.coordinator[0].cert_pem : ""
    client_key  = local.tls_mutual && each.value.coordinator ? tls_private_key.coordinator[0].private_key_pem_pkcs8 : ""
  })
  expiration_date = var.secret_expiry
  depends_on      = [azurerm_role_assignment.deployer_secrets]
}
