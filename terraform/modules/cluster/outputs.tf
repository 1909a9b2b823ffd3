# What the examples print: where the gateway is, where the nodes are, how to call it. The API key
# is only a sensitive output (terraform output -raw api_key), never a plain one.

output "gateway_url" {
  description = "Base URL of the OpenAI-compatible API (append /v1)."
  value       = "http://${var.public_gateway ? azurerm_public_ip.gateway[0].ip_address : local.coordinator_ip}:${var.gateway_port}"
}

output "node_addresses" {
  description = "Expert nodes as written in the placement: name -> host:port the coordinator dials."
  value       = { for n in local.cluster_nodes : n.name => n.addr }
}

output "vm_private_ips" {
  description = "Private IP of every VM by key (main, or coord and node0..)."
  value       = { for k, vm in local.vms : k => vm.ip }
}

output "placement_toml" {
  description = "The placement file written to /etc/nightshift/placement.toml on every VM."
  value       = local.placement_toml
}

output "nodes_toml" {
  description = "The [[node]] list for `nightshift-atlas plan --nodes` (also at /etc/nightshift/nodes.toml)."
  value       = local.nodes_toml
}

output "tls_mode" {
  description = "TLS between the coordinator and the expert nodes: \"mutual\", \"server\" (nodes present certificates, the token authenticates the coordinator) or \"off\" (plaintext gRPC)."
  value       = local.tls_mutual ? "mutual" : local.tls_on ? "server" : "off"
}

output "tls_ca_cert_pem" {
  description = "CA certificate (PEM, public) every node and coordinator certificate chains to; empty when TLS is off."
  value       = local.tls_ca_cert_pem
}

output "key_vault_name" {
  description = "Key Vault holding the API key (secret nightshift-api-key) and the node token."
  value       = azurerm_key_vault.this.name
}

output "api_key" {
  description = "The gateway API key (sensitive: terraform output -raw api_key)."
  value       = azurerm_key_vault_secret.api_key.value
  sensitive   = true
}

output "model_name" {
  description = "Model id clients pass as `model`."
  value       = var.model_name
}

output "resource_group_name" {
  description = "Resource group holding everything (delete it, or terraform destroy, to tear down)."
  value       = azurerm_resource_group.this.name
}
