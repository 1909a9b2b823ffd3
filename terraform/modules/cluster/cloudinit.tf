# What runs on the VMs: the placement, the systemd units and the prepare script, rendered from
# templates/ and packed into one cloud-init document per VM (no secret in it: the prepare script
# fetches the token, the API key and the TLS PEMs from Key Vault; tls.tf says which go where).
# Every templatefile() call lists its variables one per line: terraform/tests checks them against
# the variables each template uses.

locals {
  tpl_dir          = "${path.module}/templates"
  bin_dir          = "/usr/local/bin"
  model_dir        = "/models"
  state_dir        = "/var/lib/nightshift"
  placement_path   = "/etc/nightshift/placement.toml"
  nodes_path       = "/etc/nightshift/nodes.toml"
  node_token_path  = "/etc/nightshift/node-token"
  api_key_env_file = "/etc/nightshift/api-key.env"
  prepare_path     = "/usr/local/lib/nightshift/prepare.sh"
  model_path       = "${local.model_dir}/${var.model_files[0]}"
  single           = var.layout == "single-vm"

  coordinator_ip = cidrhost(var.subnet_prefix, 4)

  # Expert nodes as the placement names them.
  cluster_nodes = local.single ? tolist([
    for i in range(var.numa_nodes) : {
      name         = "numa${i}"
      addr         = "127.0.0.1:${var.node_port_prefix}${i}"
      has_numa     = true
      numa         = i
      memory_bytes = var.node_memory_bytes
    }
    ]) : tolist([
    for i in range(var.node_count) : {
      name         = "node${i}"
      addr         = "${cidrhost(var.subnet_prefix, 10 + i)}:${var.node_port}"
      has_numa     = false
      numa         = 0
      memory_bytes = var.node_memory_bytes
    }
  ])

  # VMs: key -> role. The single-VM layout runs the coordinator and every node on "main".
  # tomap() on both branches: a conditional needs one type, and two object literals with different
  # keys would not unify.
  vms = local.single ? tomap({
    main = { role = "single-vm", size = var.single_vm_size, ip = local.coordinator_ip, coordinator = true, node_name = "" }
    }) : merge(
    tomap({ coord = { role = "coordinator", size = var.coordinator_vm_size, ip = local.coordinator_ip, coordinator = true, node_name = "" } }),
    { for i in range(var.node_count) : "node${i}" => {
      role        = "expert-node"
      size        = var.node_vm_size
      ip          = cidrhost(var.subnet_prefix, 10 + i)
      coordinator = false
      node_name   = "node${i}"
    } }
  )

  placement_toml = templatefile("${local.tpl_dir}/placement.toml.tftpl", {
    nodes = local.cluster_nodes
  })
  nodes_toml = templatefile("${local.tpl_dir}/nodes.toml.tftpl", {
    nodes = local.cluster_nodes
  })

  coordinator_unit = templatefile("${local.tpl_dir}/nightshift.service.tftpl", {
    bin_dir             = local.bin_dir
    model_path          = local.model_path
    model_dir           = local.model_dir
    model_name          = var.model_name
    placement_path      = local.placement_path
    gateway_host        = "0.0.0.0"
    gateway_port        = var.gateway_port
    node_token_path     = local.node_token_path
    api_key_env_file    = local.api_key_env_file
    state_dir           = local.state_dir
    expert_deadline_ms  = var.expert_deadline_ms
    max_seqs            = var.max_seqs
    ctx                 = var.ctx
    set_threads         = var.coordinator_threads > 0
    coordinator_threads = var.coordinator_threads
    record_atlas        = var.record_atlas
    single_vm           = local.single
    local_node_units    = join(" ", [for i in range(var.numa_nodes) : "nightshift-expert-node@${i}.service"])
    tls                 = local.tls_on
    tls_mutual          = local.tls_mutual
    tls_ca_path         = local.tls_ca_path
    tls_client_cert     = local.tls_client_cert_path
    tls_client_key      = local.tls_client_key_path
  })

  numa_node_unit = templatefile("${local.tpl_dir}/nightshift-expert-node@.service.tftpl", {
    bin_dir          = local.bin_dir
    model_path       = local.model_path
    model_dir        = local.model_dir
    placement_path   = local.placement_path
    node_port_prefix = var.node_port_prefix
    node_token_path  = local.node_token_path
    set_threads      = var.node_threads > 0
    node_threads     = var.node_threads
    tls              = local.tls_on
    tls_mutual       = local.tls_mutual
    tls_ca_path      = local.tls_ca_path
    tls_node_cert    = local.tls_node_cert_path
    tls_node_key     = local.tls_node_key_path
  })

  prepare_unit = templatefile("${local.tpl_dir}/nightshift-prepare.service.tftpl", {
    script_path = local.prepare_path
  })

  vm_files = { for k, vm in local.vms : k => concat(
    [
      { path = local.placement_path, permissions = "0644", content = local.placement_toml },
      { path = local.nodes_path, permissions = "0644", content = local.nodes_toml },
      { path = "/etc/systemd/system/nightshift-prepare.service", permissions = "0644", content = local.prepare_unit },
      { path = local.prepare_path, permissions = "0755", content = templatefile("${local.tpl_dir}/nightshift-prepare.sh.tftpl", {
        bin_dir                = local.bin_dir
        model_dir              = local.model_dir
        state_dir              = local.state_dir
        release_url            = var.release_url
        release_sha256         = var.release_sha256
        model_blob_url         = var.model_blob_url
        model_files            = var.model_files
        identity_client_id     = azurerm_user_assigned_identity.vm.client_id
        key_vault_uri          = trimsuffix(azurerm_key_vault.this.vault_uri, "/")
        node_token_secret_name = azurerm_key_vault_secret.node_token.name
        api_key_secret_name    = azurerm_key_vault_secret.api_key.name
        node_token_path        = local.node_token_path
        api_key_env_file       = local.api_key_env_file
        is_coordinator         = vm.coordinator
        tls                    = local.tls_on
        tls_dir                = local.tls_dir
        tls_secret_name        = local.tls_on ? azurerm_key_vault_secret.tls[k].name : ""
        tls_files              = local.tls_files[k]
      }) },
      { path = "/etc/systemd/system/nightshift-cluster.target", permissions = "0644", content = templatefile("${local.tpl_dir}/nightshift-cluster.target.tftpl", {
        role  = vm.role
        wants = join(" ", local.units_of[k])
      }) },
    ],
    vm.coordinator ? [{ path = "/etc/systemd/system/nightshift.service", permissions = "0644", content = local.coordinator_unit }] : [],
    local.single ? [{ path = "/etc/systemd/system/nightshift-expert-node@.service", permissions = "0644", content = local.numa_node_unit }] : [],
    !local.single && !vm.coordinator ? [{ path = "/etc/systemd/system/nightshift-expert-node.service", permissions = "0644", content = templatefile("${local.tpl_dir}/nightshift-expert-node.service.tftpl", {
      bin_dir         = local.bin_dir
      model_path      = local.model_path
      model_dir       = local.model_dir
      placement_path  = local.placement_path
      node_name       = vm.node_name
      node_port       = var.node_port
      link_port       = var.node_port + 1
      node_token_path = local.node_token_path
      set_threads     = var.node_threads > 0
      node_threads    = var.node_threads
      tls             = local.tls_on
      tls_mutual      = local.tls_mutual
      tls_ca_path     = local.tls_ca_path
      tls_node_cert   = local.tls_node_cert_path
      tls_node_key    = local.tls_node_key_path
    }) }] : [],
  ) }

  # Units the cluster target pulls in on each VM.
  units_of = { for k, vm in local.vms : k => concat(
    vm.coordinator ? ["nightshift.service"] : [],
    local.single ? [for i in range(var.numa_nodes) : "nightshift-expert-node@${i}.service"] : [],
    !local.single && !vm.coordinator ? ["nightshift-expert-node.service"] : [],
  ) }

  custom_data = { for k, vm in local.vms : k => templatefile("${local.tpl_dir}/cloud-init.yaml.tftpl", {
    role         = vm.role
    files        = [for f in local.vm_files[k] : { path = f.path, permissions = f.permissions, content_b64 = base64encode(f.content) }]
    enable_units = ["nightshift-prepare.service", "nightshift-cluster.target"]
  }) }
}
