# What `terraform apply` prints: the gateway, the nodes and a ready-to-run openai snippet. The
# API key stays out of plain outputs: `terraform output -raw api_key`.

output "gateway_url" {
  description = "Base URL of the OpenAI-compatible API."
  value       = module.cluster.gateway_url
}

output "node_addresses" {
  description = "Expert nodes (placement name -> host:port)."
  value       = module.cluster.node_addresses
}

output "placement_toml" {
  description = "Placement written on the VMs (/etc/nightshift/placement.toml)."
  value       = module.cluster.placement_toml
}

output "api_key" {
  description = "Gateway API key (sensitive; terraform output -raw api_key)."
  value       = module.cluster.api_key
  sensitive   = true
}

output "tls_mode" {
  description = "TLS between coordinator and nodes: mutual, server or off."
  value       = module.cluster.tls_mode
}

output "key_vault_name" {
  description = "Key Vault holding the API key (secret nightshift-api-key)."
  value       = module.cluster.key_vault_name
}

output "openai_snippet" {
  description = "Python snippet calling the cluster with the official openai package."
  value       = <<-EOT
    # pip install openai; export NIGHTSHIFT_API_KEY="$(terraform output -raw api_key)"
    import os
    from openai import OpenAI
    client = OpenAI(base_url="${module.cluster.gateway_url}/v1", api_key=os.environ["NIGHTSHIFT_API_KEY"])
    r = client.chat.completions.create(model="${module.cluster.model_name}", messages=[{"role": "user", "content": "Hello!"}])
    print(r.choices[0].message.content)
  EOT
}
