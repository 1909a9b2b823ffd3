# The VMs (Cobalt 100, Ubuntu 24.04 arm64), their proximity placement group and one model disk per
# VM: Premium SSD v2 restored from model_snapshot_id, or empty and filled once from model_blob_url.

resource "azurerm_proximity_placement_group" "this" {
  count               = var.proximity_placement_group ? 1 : 0
  name                = "${var.name}-ppg"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  zone                = var.zone
  allowed_vm_sizes    = distinct([for vm in values(local.vms) : vm.size])
  tags                = var.tags
}

resource "azurerm_linux_virtual_machine" "vm" {
  for_each                        = local.vms
  name                            = "${var.name}-${each.key}"
  computer_name                   = "${var.name}-${each.key}"
  location                        = azurerm_resource_group.this.location
  resource_group_name             = azurerm_resource_group.this.name
  size                            = each.value.size
  zone                            = var.zone
  proximity_placement_group_id    = var.proximity_placement_group ? azurerm_proximity_placement_group.this[0].id : null
  admin_username                  = var.admin_username
  disable_password_authentication = true
  allow_extension_operations      = false
  provision_vm_agent              = true
  encryption_at_host_enabled      = var.encryption_at_host
  network_interface_ids           = [azurerm_network_interface.vm[each.key].id]
  custom_data                     = base64encode(local.custom_data[each.key])
  priority                        = var.spot ? "Spot" : "Regular"
  eviction_policy                 = var.spot ? var.spot_eviction_policy : null
  max_bid_price                   = var.spot ? var.spot_max_price : null
  tags                            = merge(var.tags, { nightshift-role = each.value.role })

  admin_ssh_key {
    username   = var.admin_username
    public_key = var.admin_ssh_public_key
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.vm.id]
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
    disk_size_gb         = var.os_disk_size_gb
  }

  source_image_reference {
    publisher = "Canonical"
    offer     = "ubuntu-24_04-lts"
    sku       = "server-arm64"
    version   = "latest"
  }

  depends_on = [
    azurerm_role_assignment.vm_secrets,
    azurerm_key_vault_secret.api_key,
    azurerm_key_vault_secret.node_token,
    azurerm_key_vault_secret.tls,
  ]
}

resource "azurerm_managed_disk" "model" {
  #checkov:skip=CKV_AZURE_93:platform-managed keys; set a disk encryption set on the resource group policy if your tenant requires customer-managed keys
  for_each                      = local.vms
  name                          = "${var.name}-${each.key}-model"
  location                      = azurerm_resource_group.this.location
  resource_group_name           = azurerm_resource_group.this.name
  zone                          = var.zone
  storage_account_type          = var.model_disk_sku
  create_option                 = var.model_snapshot_id != "" ? "Copy" : "Empty"
  source_resource_id            = var.model_snapshot_id != "" ? var.model_snapshot_id : null
  disk_size_gb                  = var.model_disk_size_gb
  disk_iops_read_write          = var.model_disk_sku == "PremiumV2_LRS" ? var.model_disk_iops : null
  disk_mbps_read_write          = var.model_disk_sku == "PremiumV2_LRS" ? var.model_disk_mbps : null
  public_network_access_enabled = false
  network_access_policy         = "DenyAll"
  tags                          = var.tags
}

resource "azurerm_virtual_machine_data_disk_attachment" "model" {
  for_each           = local.vms
  managed_disk_id    = azurerm_managed_disk.model[each.key].id
  virtual_machine_id = azurerm_linux_virtual_machine.vm[each.key].id
  lun                = 0
  caching            = var.model_disk_sku == "PremiumV2_LRS" ? "None" : "ReadOnly"
}
