"""TLS between the coordinator and the expert nodes, as the module wires it: per layout and
setting, the rendered units carry exactly the expected --tls-* flags (none with TLS off or on the
single-VM loopback by default), every file a flag names is written by that VM's prepare script
with the right owner and mode (keys 0600, certificates 0644), the prepare script's TLS step really
writes them from a Key Vault bundle (run with stubs), no PEM ever reaches cloud-init, and, when
terraform is installed, tls.tf's locals evaluated by terraform give each node certificate its
placement address as SAN and each VM the files the Python model says.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import hcl2
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_model as cm  # noqa: E402

D = "/etc/nightshift/tls"
MUTUAL_NODE = {"--tls-cert": f"{D}/node.pem", "--tls-key": f"{D}/node-key.pem", "--tls-client-ca": f"{D}/ca.pem"}
SERVER_NODE = {"--tls-cert": f"{D}/node.pem", "--tls-key": f"{D}/node-key.pem"}
MUTUAL_COORD = {"--tls-ca": f"{D}/ca.pem", "--tls-client-cert": f"{D}/coordinator.pem",
                "--tls-client-key": f"{D}/coordinator-key.pem"}
SERVER_COORD = {"--tls-ca": f"{D}/ca.pem"}

# (layout, settings, --tls-* flags of every expert-node command line, of the coordinator's)
CASES = [
    ("multi-vm", {}, MUTUAL_NODE, MUTUAL_COORD),
    ("multi-vm", {"tls_mutual": False}, SERVER_NODE, SERVER_COORD),
    ("multi-vm", {"tls_enabled": False}, {}, {}),
    ("multi-vm", {"tls_enabled": False, "tls_loopback": True}, {}, {}),
    ("single-vm", {}, {}, {}),
    ("single-vm", {"tls_loopback": True}, MUTUAL_NODE, MUTUAL_COORD),
    ("single-vm", {"tls_loopback": True, "tls_mutual": False}, SERVER_NODE, SERVER_COORD),
    ("single-vm", {"tls_loopback": True, "tls_enabled": False}, {}, {}),
]
IDS = [f"{l}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'defaults'}" for l, o, _, _ in CASES]

PREPARE = "/usr/local/lib/nightshift/prepare.sh"
_WRITE = re.compile(r"""^jq -je '\.([a-z_]+) \| select\(\. != ""\)' <<<"\$b" > "([^"]+)\.new"$""", re.M)
_CHMOD = re.compile(r'chmod ([0-7]{4}) "([^"]+)\.new"; mv -f "\2\.new" "\2"')
_CHOWN = re.compile(r'chown nightshift:nightshift "([^"]+)\.new"')


def tls_flags(argv):
    return {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--tls")}


def units_argv(files, s):
    """(unit name, argv) of every NightShift command line in a VM's files, %i expanded."""
    out = []
    for path, _, content in files:
        name = Path(path).name
        if name.endswith(".service") and name != "nightshift-prepare.service":
            for cmd in cm.exec_starts(content):
                insts = range(s["numa_nodes"]) if name.endswith("@.service") else [None]
                out += [(name, cm.systemd_argv(cmd, i)) for i in insts]
    return out


def prepare_writes(script):
    """path -> (bundle field, mode, chowned to the service user) of the prepare script's TLS step."""
    modes = {p: m for m, p in _CHMOD.findall(script)}
    owned = set(_CHOWN.findall(script))
    return {p: (field, modes.get(p), p in owned) for field, p in _WRITE.findall(script)}


@pytest.mark.parametrize("layout,over,node_flags,coord_flags", CASES, ids=IDS)
def test_units_carry_the_tls_flags_and_prepare_writes_their_files(layout, over, node_flags, coord_flags):
    s = cm.sample_settings(**over)
    seen_nodes = seen_coord = 0
    for key, files in cm.vm_files(layout, s).items():
        by_path = {p: (m, c) for p, m, c in files}
        script = by_path[PREPARE][1]
        writes = prepare_writes(script)
        for name, argv in units_argv(files, s):
            flags = tls_flags(argv)
            if name.startswith("nightshift-expert-node"):
                assert flags == node_flags, f"{key}:{name}: {argv}"
                seen_nodes += 1
            else:
                assert flags == coord_flags, f"{key}:{name}: {argv}"
                assert "--tls-domain" not in argv, "nodes are checked against their own addr, not one name"
                seen_coord += 1
            for flag, path in flags.items():
                assert path in writes, f"{key}: {flag} {path} is not written by the prepare script"
                field, mode, owned = writes[path]
                want = "0600" if flag.endswith("-key") else "0644"
                assert (mode, owned) == (want, True), f"{key}: {path} written {mode}, owned by nightshift={owned}"
                assert field.endswith("key") == flag.endswith("-key"), f"{key}: {flag} gets the bundle's {field}"
        if node_flags:
            assert f'b=$(secret "nightshift-tls-{key}")' in script
            assert f'install -d -m 0750 -o nightshift -g nightshift "{D}"' in script
            needed = {p for _, argv in units_argv(files, s) for p in tls_flags(argv).values()}
            assert set(writes) == needed, f"{key}: the prepare script writes {sorted(writes)}, units read {sorted(needed)}"
        else:
            assert not writes and "nightshift-tls" not in script and "/tls" not in script, key
        assert all(m != "0600" for m, _ in by_path.values()), "no key file is written by cloud-init itself"
    assert seen_coord == 1
    assert seen_nodes == (s["numa_nodes"] if layout == "single-vm" else s["node_count"])


def test_prepare_tls_step_writes_the_bundle_with_owner_and_modes(tmp_path):
    """The rendered prepare script's TLS step, run with Key Vault, install and chown stubbed."""
    if not shutil.which("jq"):
        pytest.skip("jq is not installed: the prepare script's TLS step (which uses jq, as on the VMs) not run")
    on_vm = cm.vm_files("single-vm", cm.sample_settings(tls_loopback=True))["main"]
    assert 'b=$(secret "nightshift-tls-main")' in dict((p, c) for p, _, c in on_vm)[PREPARE]
    tls_dir = tmp_path / "tls"
    s = cm.sample_settings(tls_loopback=True, tls_dir=str(tls_dir))
    script = dict((p, c) for p, _, c in cm.vm_files("single-vm", s)["main"])[PREPARE]
    bundle = {"ca": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
              "node_cert": "-----BEGIN CERTIFICATE-----\nNODE\n-----END CERTIFICATE-----\n",
              "node_key": "-----BEGIN PRIVATE KEY-----\nNODEKEY\n-----END PRIVATE KEY-----\n",
              "client_cert": "-----BEGIN CERTIFICATE-----\nCOORD\n-----END CERTIFICATE-----\n",
              "client_key": "-----BEGIN PRIVATE KEY-----\nCOORDKEY\n-----END PRIVATE KEY-----\n"}

    def run(b):
        return cm.run_prepare_tls_step(script, b, tmp_path)

    r = run(bundle)
    assert r.returncode == 0, r.stderr
    files = {"ca.pem": ("ca", 0o644), "node.pem": ("node_cert", 0o644), "node-key.pem": ("node_key", 0o600),
             "coordinator.pem": ("client_cert", 0o644), "coordinator-key.pem": ("client_key", 0o600)}
    assert sorted(p.name for p in tls_dir.iterdir()) == sorted(files)
    chowned = (tmp_path / "chown.log").read_text().split("\n")
    for name, (field, mode) in files.items():
        p = tls_dir / name
        assert p.read_text() == bundle[field], name
        assert p.stat().st_mode & 0o777 == mode, f"{name}: {oct(p.stat().st_mode & 0o777)}"
        assert f"nightshift:nightshift {p}.new" in chowned, name
    # a bundle lacking a PEM this VM needs fails the unit (so the services never start without it)
    r = run({**bundle, "client_key": ""})
    assert r.returncode != 0


def test_no_pem_reaches_cloud_init():
    for layout in ["single-vm", "multi-vm"]:
        s = cm.sample_settings(tls_loopback=True)
        for key, text in cm.cloud_init(layout, s).items():
            full = text + "".join(base64.b64decode(b).decode() for b in re.findall(r"content: (\S+)", text))
            assert "-----BEGIN" not in full, f"{key}: a PEM in cloud-init"


def test_tls_resources_are_wired():
    """tls.tf as parsed: node certificates carry the names computed per VM, are signed for server
    auth by the cluster CA; the coordinator's for client auth; the keys sent are PKCS#8."""
    doc = hcl2.load(open(cm.MODULE / "tls.tf"))
    res = {}
    for block in doc["resource"]:
        for rtype, named in block.items():
            for name, body in named.items():
                res[f"{rtype}.{name}"] = body
    one = lambda v: v[0] if isinstance(v, list) and len(v) == 1 else v  # noqa: E731
    req = res["tls_cert_request.node"]
    assert one(req["ip_addresses"]) == "${each.value.ip_addresses}"
    assert one(req["dns_names"]) == "${each.value.dns_names}"
    assert one(res["tls_locally_signed_cert.node"]["allowed_uses"]) == ["digital_signature", "key_encipherment", "server_auth"]
    assert one(res["tls_locally_signed_cert.coordinator"]["allowed_uses"]) == ["digital_signature", "client_auth"]
    assert one(res["tls_self_signed_cert.ca"]["is_ca_certificate"]) is True
    value = one(res["azurerm_key_vault_secret.tls"]["value"])
    assert "private_key_pem_pkcs8" in value and "tls_locally_signed_cert.node[each.key].cert_pem" in value
    assert one(res["azurerm_key_vault_secret.tls"]["expiration_date"]) == "${var.secret_expiry}"
    versions = (cm.MODULE / "versions.tf").read_text()
    assert 'source  = "hashicorp/tls"' in versions
    compute = (cm.MODULE / "compute.tf").read_text()
    assert "azurerm_key_vault_secret.tls," in compute, "VMs must wait for their TLS secret"


def _locals_block(text):
    """The body of the first top-level `locals {` block."""
    i = text.index("\nlocals {") + len("\nlocals {")
    depth, j = 1, i
    while depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1]


def _attributes(body, names):
    """Top-level attributes `names` of a locals body, as HCL text."""
    parts = re.split(r"(?m)^(?=  [a-z_][a-z0-9_]*\s*=)", body)
    return "".join(p for p in parts if re.match(r"  ([a-z_][a-z0-9_]*)", p) and
                   re.match(r"  ([a-z_][a-z0-9_]*)", p).group(1) in names)


def test_tls_locals_evaluated_by_terraform(tmp_path):
    """tls.tf's locals evaluated by terraform itself (provider-less: the module's variables, the
    layout locals of cloudinit.tf, the CA resources replaced by a placeholder): every node
    certificate names the host of every placement addr it serves, and each VM gets exactly the
    files the Python model (which the template tests use) gives it."""
    tf = shutil.which("terraform")
    if not tf:
        pytest.skip("terraform is not installed: tls locals not evaluated")
    m = tmp_path / "m"
    m.mkdir()
    shutil.copy(cm.MODULE / "variables.tf", m / "variables.tf")
    layout_locals = _attributes(_locals_block((cm.MODULE / "cloudinit.tf").read_text()),
                                {"single", "coordinator_ip", "cluster_nodes", "vms"})
    tls_locals = _locals_block((cm.MODULE / "tls.tf").read_text())
    for ref in ("tls_self_signed_cert.ca[0].cert_pem", "tls_private_key.ca[0].private_key_pem"):
        assert ref in tls_locals
        tls_locals = tls_locals.replace(ref, '"MOCK"')
    (m / "main.tf").write_text(
        "locals {\n" + layout_locals + tls_locals + "}\n"
        'output "r" {\n  value = { nodes = local.tls_node_vms, files = local.tls_files, '
        "cluster_nodes = local.cluster_nodes, vms = local.vms }\n}\n")
    required = dict(name="nightshift", location="westeurope", allowed_cidrs=["203.0.113.0/24"],
                    admin_ssh_public_key="ssh-ed25519 AAAA", release_url="https://example.invalid/r.tgz",
                    model_files=["m.gguf"], subnet_prefix="10.42.1.0/24", node_count=3, numa_nodes=2)
    root = ""
    for i, (layout, over, _, _) in enumerate(CASES):
        inputs = {**required, "layout": layout, **over}
        root += f'module "c{i}" {{\n  source = "./m"\n' + "".join(
            f"  {k} = {json.dumps(v)}\n" for k, v in inputs.items()) + "}\n"
        root += f'output "c{i}" {{\n  value = module.c{i}.r\n}}\n'
    (tmp_path / "main.tf").write_text(root)
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    for cmd in (["init", "-input=false", "-no-color"], ["apply", "-auto-approve", "-input=false", "-no-color"]):
        r = subprocess.run([tf, *cmd], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([tf, "output", "-json"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    got = json.loads(r.stdout)
    for i, (layout, over, node_flags, _) in enumerate(CASES):
        out = got[f"c{i}"]["value"]
        s = cm.sample_settings(**over)
        assert [n["addr"] for n in out["cluster_nodes"]] == [n["addr"] for n in cm.cluster_nodes(layout, s)]
        assert out["files"] == {k: cm.tls_files(layout, s, c, layout == "single-vm" or not c)
                                for k, (_, c, _) in cm.vms(layout, s).items()}, IDS[i]
        if not node_flags:
            assert out["nodes"] == {}, IDS[i]
            continue
        assert {k: (v["ip_addresses"], v["dns_names"]) for k, v in out["nodes"].items()} == \
            {k: (list(ips), names) for k, (ips, names) in cm.tls_sans(layout, s).items()}, IDS[i]
        for k, cert in out["nodes"].items():
            vm = out["vms"][k]
            served = [n for n in out["cluster_nodes"] if layout == "single-vm" or n["name"] == vm["node_name"]]
            assert served, k
            for n in served:
                host = n["addr"].rsplit(":", 1)[0]
                assert host in cert["ip_addresses"], f"{IDS[i]}: {k}'s certificate lacks {host} ({n['name']})"
                assert n["name"] in cert["dns_names"]
