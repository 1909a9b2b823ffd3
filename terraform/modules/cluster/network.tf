# Resource group, VNet/subnet and the NSG: the gateway port only from allowed_cidrs, the expert
# nodes' gRPC port and data link (the port after it) only from inside the subnet, SSH only from ssh_allowed_cidrs (none by default).

resource "azurerm_resource_group" "this" {
  name     = "${var.name}-rg"
  location = var.location
  tags     = var.tags
}

resource "azurerm_virtual_network" "this" {
  name                = "${var.name}-vnet"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  address_space       = [var.address_space]
  tags                = var.tags
}

resource "azurerm_subnet" "cluster" {
  name                            = "${var.name}-cluster"
  resource_group_name             = azurerm_resource_group.this.name
  virtual_network_name            = azurerm_virtual_network.this.name
  address_prefixes                = [var.subnet_prefix]
  service_endpoints               = ["Microsoft.KeyVault", "Microsoft.Storage"]
  default_outbound_access_enabled = true
}

resource "azurerm_network_security_group" "cluster" {
  name                = "${var.name}-nsg"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  tags                = var.tags

  security_rule {
    name                       = "gateway-from-allowed"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = tostring(var.gateway_port)
    source_address_prefixes    = var.allowed_cidrs
    destination_address_prefix = local.coordinator_ip
  }

  security_rule {
    name                       = "grpc-within-subnet"
    priority                   = 110
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = tostring(var.node_port)
    source_address_prefix      = var.subnet_prefix
    destination_address_prefix = var.subnet_prefix
  }

  # The expert nodes' framed data link (layer calls), on the port after gRPC's.
  security_rule {
    name                       = "link-within-subnet"
    priority                   = 111
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = tostring(var.node_port + 1)
    source_address_prefix      = var.subnet_prefix
    destination_address_prefix = var.subnet_prefix
  }

  dynamic "security_rule" {
    for_each = length(var.ssh_allowed_cidrs) > 0 ? [1] : []
    content {
      name                       = "ssh-from-admins"
      priority                   = 120
      direction                  = "Inbound"
      access                     = "Allow"
      protocol                   = "Tcp"
      source_port_range          = "*"
      destination_port_range     = "22"
      source_address_prefixes    = var.ssh_allowed_cidrs
      destination_address_prefix = var.subnet_prefix
    }
  }

  # Explicit: nothing else from the VNet or the internet (Azure's defaults allow VNet-to-VNet).
  security_rule {
    name                       = "deny-all-other-inbound"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "*"
    destination_address_prefix = "*"
  }
}

resource "azurerm_subnet_network_security_group_association" "cluster" {
  subnet_id                 = azurerm_subnet.cluster.id
  network_security_group_id = azurerm_network_security_group.cluster.id
}

resource "azurerm_public_ip" "gateway" {
  count               = var.public_gateway ? 1 : 0
  name                = "${var.name}-gateway-ip"
  location            = azurerm_resource_group.this.location
  resource_group_name = azurerm_resource_group.this.name
  allocation_method   = "Static"
  sku                 = "Standard"
  zones               = [var.zone]
  tags                = var.tags
}

resource "azurerm_network_interface" "vm" {
  #checkov:skip=CKV_AZURE_119:only the coordinator's NIC gets a public IP, and only with public_gateway = true; the NSG admits the gateway port from allowed_cidrs alone
  for_each                       = local.vms
  name                           = "${var.name}-${each.key}-nic"
  location                       = azurerm_resource_group.this.location
  resource_group_name            = azurerm_resource_group.this.name
  accelerated_networking_enabled = true
  tags                           = var.tags

  ip_configuration {
    name                          = "primary"
    subnet_id                     = azurerm_subnet.cluster.id
    private_ip_address_allocation = "Static"
    private_ip_address            = each.value.ip
    public_ip_address_id          = each.value.coordinator && var.public_gateway ? azurerm_public_ip.gateway[0].id : null
  }
}
