# The VMs' managed identity, the Key Vault holding the API key and the node token, and the role
# assignments that let the VMs read them (and the model blobs) at boot. Secrets never appear in
# custom_data or in plain outputs.

data "azurerm_client_config" "current" {}

resource "azurerm_user_assigned_identity" "vm" {
  name                = "${var.name}-vm-identity"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = var.tags
}

resource "random_string" "vault_suffix" {
  length  = 5
  upper   = false
  special = false
}

resource "azurerm_key_vault" "this" {
  #checkov:skip=CKV2_AZURE_32:the VMs reach the vault through the subnet's Microsoft.KeyVault service endpoint and the firewall admits only that subnet and key_vault_allowed_ips; a private endpoint would add a private DNS zone for two secrets
  name                          = "${substr(replace(var.name, "-", ""), 0, 16)}kv${random_string.vault_suffix.result}"
  location                      = azurerm_resource_group.this.location
  resource_group_name           = azurerm_resource_group.this.name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "standard"
  enable_rbac_authorization     = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 7
  public_network_access_enabled = true
  tags                          = var.tags

  network_acls {
    default_action             = "Deny"
    bypass                     = "AzureServices"
    ip_rules                   = var.key_vault_allowed_ips
    virtual_network_subnet_ids = [azurerm_subnet.cluster.id]
  }
}

# terraform itself writes the secrets; the VMs only read them.
resource "azurerm_role_assignment" "deployer_secrets" {
  scope                = azurerm_key_vault.this.id
  role_definition_name = "Key Vault Secrets Officer"
  principal_id         = data.azurerm_client_config.current.object_id
}

resource "azurerm_role_assignment" "vm_secrets" {
  scope                = azurerm_key_vault.this.id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.vm.principal_id
  principal_type       = "ServicePrincipal"
}

resource "azurerm_role_assignment" "vm_model_blobs" {
  count                = var.model_storage_scope != "" ? 1 : 0
  scope                = var.model_storage_scope
  role_definition_name = "Storage Blob Data Reader"
  principal_id         = azurerm_user_assigned_identity.vm.principal_id
  principal_type       = "ServicePrincipal"
}

resource "random_password" "api_key" {
  length  = 48
  special = false
}

resource "random_password" "node_token" {
  length  = 48
  special = false
}

resource "azurerm_key_vault_secret" "api_key" {
  name            = "nightshift-api-key"
  value           = var.api_key != "" ? var.api_key : random_password.api_key.result
  key_vault_id    = azurerm_key_vault.this.id
  content_type    = "text/plain; OpenAI Bearer key of the NightShift gateway"
  expiration_date = var.secret_expiry
  depends_on      = [azurerm_role_assignment.deployer_secrets]
}

resource "azurerm_key_vault_secret" "node_token" {
  name            = "nightshift-node-token"
  value           = random_password.node_token.result
  key_vault_id    = azurerm_key_vault.this.id
  content_type    = "text/plain; shared token between coordinator and expert nodes"
  expiration_date = var.secret_expiry
  depends_on      = [azurerm_role_assignment.deployer_secrets]
}
