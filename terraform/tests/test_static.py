"""Static checks of terraform/ without cloud access: every .tf parses (python-hcl2), variables
and outputs are typed and documented, every templatefile() call passes exactly the variables its
template reads, the rendered systemd units' command lines use only flags our binaries' real
--help lists, the rendered placement follows the placement contract, the cloud-init documents are
valid YAML that carry no secret, the NSG opens nothing to the world, and checkov finds nothing.
"""

import base64
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import hcl2
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_model as cm  # noqa: E402
import tftemplate  # noqa: E402

TF_FILES = sorted(p for p in cm.TF_ROOT.rglob("*.tf") if ".terraform" not in p.parts)
LAYOUTS = ["single-vm", "multi-vm"]


def parsed(path):
    with open(path) as f:
        return hcl2.load(f)


def test_there_is_something_to_check():
    names = {p.relative_to(cm.TF_ROOT).as_posix() for p in TF_FILES}
    for must in ["modules/cluster/variables.tf", "modules/cluster/compute.tf",
                 "examples/single-vm-numa/main.tf", "examples/multi-vm/main.tf"]:
        assert must in names
    for ex in ["single-vm-numa", "multi-vm"]:
        assert (cm.TF_ROOT / "examples" / ex / "terraform.tfvars.example").exists()
    r = subprocess.run(["bash", "-n", str(cm.TF_ROOT / "scripts" / "prices.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", TF_FILES, ids=lambda p: p.relative_to(cm.TF_ROOT).as_posix())
def test_tf_parses_and_is_documented(path):
    doc = parsed(path)
    for block in doc.get("variable", []):
        for name, body in block.items():
            assert "type" in body, f"{path}: variable {name} has no type"
            assert body.get("description", [""])[0].strip(), f"{path}: variable {name} has no description"
    for block in doc.get("output", []):
        for name, body in block.items():
            assert body.get("description", [""])[0].strip(), f"{path}: output {name} has no description"
            secretish = re.search(r"key|token|secret|password", name) and name != "key_vault_name"
            if secretish:
                assert body.get("sensitive", [False])[0] is True, f"{path}: output {name} must be sensitive"


def test_examples_pass_only_declared_module_variables():
    declared = {n for b in parsed(cm.MODULE / "variables.tf")["variable"] for n in b}
    required = {n for b in parsed(cm.MODULE / "variables.tf")["variable"] for n, body in b.items() if "default" not in body}
    for ex in ["single-vm-numa", "multi-vm"]:
        mod = parsed(cm.TF_ROOT / "examples" / ex / "main.tf")["module"][0]["cluster"]
        passed = {k for k in mod if not k.startswith("__") and k != "source"}
        assert passed <= declared, f"{ex}: unknown module inputs {passed - declared}"
        assert required <= passed, f"{ex}: required module inputs missing {required - passed}"
        ex_vars = {n for b in parsed(cm.TF_ROOT / "examples" / ex / "variables.tf")["variable"] for n in b}
        tfvars = (cm.TF_ROOT / "examples" / ex / "terraform.tfvars.example").read_text()
        set_in_example = set(re.findall(r"^([a-z_]+)\s*=", tfvars, re.M))
        assert set_in_example <= ex_vars, f"{ex}: tfvars.example sets undeclared {set_in_example - ex_vars}"
        assert "api_key" not in set_in_example, "the example tfvars must not carry a key"


def templatefile_calls():
    """(tf file, template name, keys passed) for every templatefile() call of the module."""
    calls = []
    for path in sorted(cm.MODULE.glob("*.tf")):
        text = path.read_text()
        for m in re.finditer(r'templatefile\("\$\{local\.tpl_dir\}/([^"]+)",\s*\{', text):
            depth, i, keys = 1, m.end(), set()
            line_start = True
            while depth > 0:
                c = text[i]
                if depth == 1 and line_start:
                    km = re.match(r"\s*([a-z_][a-z0-9_]*)\s*=", text[i:])
                    if km:
                        keys.add(km.group(1))
                line_start = c == "\n"
                depth += {"{": 1, "}": -1, "[": 1, "]": -1, "(": 1, ")": -1}.get(c, 0)
                i += 1
            calls.append((path.name, m.group(1), keys))
    return calls


def test_templatefile_calls_pass_exactly_the_template_variables():
    calls = templatefile_calls()
    used = {name for _, name, _ in calls}
    on_disk = {p.name for p in cm.TEMPLATES.glob("*.tftpl")}
    assert used == on_disk, f"templates never rendered: {on_disk - used}; missing: {used - on_disk}"
    for tf, name, keys in calls:
        need = tftemplate.free_vars(cm.template(name))
        assert keys == need, f"{tf}: templatefile({name}) passes {sorted(keys)}, template reads {sorted(need)}"


def test_template_renderer_subset():
    def check(tpl, variables, expect):
        assert tftemplate.render(tpl, variables) == expect

    check("a ${x} b", {"x": 1}, "a 1 b")
    check("$${x} %%{y}", {}, "${x} %{y}")
    check("%{ for n in ns ~}\n[${n.a}]\n%{ endfor ~}\nend", {"ns": [{"a": 1}, {"a": 2}]}, "[1]\n[2]\nend")
    check("x%{ if f } --t ${n}%{ endif }y", {"f": True, "n": 4}, "x --t 4y")
    check("x%{ if f } --t ${n}%{ else } no%{ endif }y", {"f": False, "n": 4}, "x noy")
    check("a   ${~ x ~}   b", {"x": "X"}, "aXb")
    # HCL trims one line token only: blank lines and the next line's indentation survive
    check("%{ for n in ns ~}\n\n  [${n}]\n%{ endfor ~}\n", {"ns": [1]}, "\n  [1]\n")
    check("a\n\n  %{~ if f }x%{ endif }", {"f": True}, "a\n\nx")
    check("a\n%{~ if f }x%{ endif }", {"f": True}, "ax")
    with pytest.raises(tftemplate.TemplateError):
        tftemplate.render("${upper(x)}", {"x": "a"})
    with pytest.raises(tftemplate.TemplateError):
        tftemplate.render("${y}", {"x": "a"})
    assert tftemplate.free_vars("%{ for n in ns }${n.a}${b}%{ endfor }") == {"ns", "b"}


@pytest.fixture(scope="module")
def helps():
    return {
        "nightshift-expert-node": cm.binary_help("nightshift-expert-node"),
        "nightshift serve": cm.binary_help("nightshift", "serve"),
    }


def test_help_parser_sees_the_contract_flags(helps):
    node = helps["nightshift-expert-node"]
    for f in ["model", "placement", "node", "listen", "numa", "threads", "auth-token-file"]:
        assert f in node["flags"]
    assert {"model", "placement", "node", "listen"} <= node["required"]
    serve = helps["nightshift serve"]
    for f in ["model", "placement", "host", "port", "api-key", "auth-token-file", "expert-deadline-ms"]:
        assert f in serve["flags"]
    assert cm.check_argv(["nightshift-expert-node", "--model", "m", "--bogus"], helps)
    assert cm.check_argv(["nightshift", "serve", "--port"], helps)


SETTINGS = [
    ("defaults", {}),
    ("threads and atlas set", {"node_threads": 8, "coordinator_threads": 16, "record_atlas": True}),
    ("tls off", {"tls_enabled": False}),
    ("server-only tls", {"tls_mutual": False}),
    ("tls on loopback", {"tls_loopback": True}),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("label,over", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_rendered_units_use_real_flags(layout, label, over, helps):
    s = cm.sample_settings(**over)
    checked = 0
    for key, files in cm.vm_files(layout, s).items():
        for path, _, content in files:
            name = Path(path).name
            if not name.endswith(".service") or name == "nightshift-prepare.service":
                continue
            for cmd in cm.exec_starts(content):
                instances = range(s["numa_nodes"]) if name.endswith("@.service") else [None]
                for inst in instances:
                    argv = cm.systemd_argv(cmd, inst)
                    assert argv[0].startswith(s["bin_dir"] + "/")
                    assert cm.check_argv(argv, helps) == [], f"{key}:{name}"
                    if over.get("node_threads") and "expert-node" in name:
                        assert argv[argv.index("--threads") + 1] == str(over["node_threads"])
                    if "expert-node" in name and not over.get("node_threads"):
                        assert "--threads" not in argv
                    if "expert-node" in name:
                        # nodes refuse to start without a token (unless told the network is trusted)
                        token = argv[argv.index("--auth-token-file") + 1]
                        assert token == s["node_token_path"], f"{key}:{name}"
                        assert "--insecure-no-auth" not in argv, f"{key}:{name}"
                    checked += 1
            assert "Restart=on-failure" in content, f"{key}:{name} must restart on failure"
            assert "--api-key" not in content, "the API key must come from the environment file"
    expected = s["numa_nodes"] + 1 if layout == "single-vm" else s["node_count"] + 1
    assert checked == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_placement_follows_the_contract(layout):
    s = cm.sample_settings()
    placement = cm.render("placement.toml.tftpl", {"nodes": cm.cluster_nodes(layout, s)})
    doc = tomllib.loads(placement)
    assert doc["version"] == 1 and doc["strategy"] == "round-robin"
    assert set(doc) == {"version", "strategy", "node"}
    names = [n["name"] for n in doc["node"]]
    assert len(names) == len(set(names))
    for n in doc["node"]:
        assert set(n) <= {"name", "addr", "numa", "memory_bytes", "cores"}
        host, port = n["addr"].rsplit(":", 1)
        assert host and 0 < int(port) < 65536
    if layout == "single-vm":
        assert [(n["name"], n["addr"], n["numa"]) for n in doc["node"]] == [
            ("numa0", "127.0.0.1:50050", 0), ("numa1", "127.0.0.1:50051", 1)]
    else:
        assert [n["addr"] for n in doc["node"]] == ["10.42.1.10:50051", "10.42.1.11:50051", "10.42.1.12:50051"]
        assert all("numa" not in n for n in doc["node"])
    nodes = tomllib.loads(cm.render("nodes.toml.tftpl", {"nodes": cm.cluster_nodes(layout, s)}))
    assert nodes["node"] == doc["node"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cloud_init_is_valid_and_secret_free(layout):
    s = cm.sample_settings()
    docs = cm.cloud_init(layout, s)
    assert set(docs) == ({"main"} if layout == "single-vm" else {"coord", "node0", "node1", "node2"})
    for key, text in docs.items():
        assert text.startswith("#cloud-config\n")
        doc = yaml.safe_load(text)
        paths = {}
        for f in doc["write_files"]:
            assert f["encoding"] == "b64"
            paths[f["path"]] = base64.b64decode(f["content"]).decode()
        assert "/etc/nightshift/placement.toml" in paths
        assert "/usr/local/lib/nightshift/prepare.sh" in paths
        assert ["systemctl", "enable", "nightshift-cluster.target"] in doc["runcmd"]
        target = paths["/etc/systemd/system/nightshift-cluster.target"]
        if key in ("main", "coord"):
            assert "nightshift.service" in target
            assert "NIGHTSHIFT_API_KEY" in paths["/usr/local/lib/nightshift/prepare.sh"]
        else:
            assert "NIGHTSHIFT_API_KEY" not in paths["/usr/local/lib/nightshift/prepare.sh"]
        if layout == "single-vm":
            assert "nightshift-expert-node@0.service nightshift-expert-node@1.service" in target
        full = text + "".join(paths.values())
        assert not re.search(r"NIGHTSHIFT_API_KEY=[A-Za-z0-9]", full), "no key value in cloud-init"
        bash = shutil.which("bash")
        r = subprocess.run([bash, "-n"], input=paths["/usr/local/lib/nightshift/prepare.sh"], text=True,
                           capture_output=True)
        assert r.returncode == 0, r.stderr


def test_no_template_receives_a_secret_value():
    for tf, name, keys in templatefile_calls():
        assert not ({"api_key", "node_token", "token", "password"} & keys), f"{tf}: {name} gets a secret"
    text = (cm.MODULE / "cloudinit.tf").read_text()
    assert "random_password" not in text and "var.api_key" not in text


def test_nsg_opens_nothing_to_the_world():
    nsg = parsed(cm.MODULE / "network.tf")["resource"]
    rules = []
    for block in nsg:
        for body in block.get("azurerm_network_security_group", {}).values():
            rules += body.get("security_rule", [])
            for dyn in body.get("dynamic", []):
                rules += [d["content"][0] for d in dyn.values()]
    def one(v):  # python-hcl2 wraps attribute values of blocks in one-element lists
        return v[0] if isinstance(v, list) and len(v) == 1 else v

    rules = [{k: one(v) for k, v in r.items()} for r in rules]
    by_name = {r["name"]: r for r in rules}
    assert set(by_name) == {"gateway-from-allowed", "grpc-within-subnet", "link-within-subnet", "ssh-from-admins",
                            "deny-all-other-inbound"}
    assert by_name["gateway-from-allowed"]["source_address_prefixes"] == "${var.allowed_cidrs}"
    assert by_name["gateway-from-allowed"]["destination_port_range"] == "${tostring(var.gateway_port)}"
    assert by_name["grpc-within-subnet"]["source_address_prefix"] == "${var.subnet_prefix}"
    assert by_name["grpc-within-subnet"]["destination_port_range"] == "${tostring(var.node_port)}"
    assert by_name["link-within-subnet"]["source_address_prefix"] == "${var.subnet_prefix}"
    assert by_name["link-within-subnet"]["destination_port_range"] == "${tostring(var.node_port + 1)}"
    assert by_name["ssh-from-admins"]["source_address_prefixes"] == "${var.ssh_allowed_cidrs}"
    assert by_name["ssh-from-admins"]["destination_port_range"] == "22"
    for r in rules:
        if r["access"] == "Allow":
            assert r.get("source_address_prefix") not in ("*", "0.0.0.0/0", "Internet"), r["name"]
            assert "source_address_prefix" in r or "source_address_prefixes" in r, r["name"]
    assert by_name["deny-all-other-inbound"]["access"] == "Deny"


def test_checkov_finds_nothing():
    exe = Path(sys.executable).parent / "checkov"
    assert exe.exists(), f"expected checkov at {exe} (scripts/setup.sh installs it)"
    out = subprocess.run([str(exe), "-d", str(cm.TF_ROOT), "--framework", "terraform", "--skip-download",
                          "--compact", "-o", "json"], capture_output=True, text=True, timeout=600)
    import json
    data = json.loads(out.stdout)
    reports = data if isinstance(data, list) else [data]
    failed = [c for r in reports for c in r["results"]["failed_checks"]]
    assert not failed, "\n".join(f"{c['check_id']} {c['resource']} {c['file_path']}" for c in failed)
    passed = sum(len(r["results"]["passed_checks"]) for r in reports)
    assert passed >= 20, f"checkov evaluated too little ({passed} passed checks)"
    # every suppression carries a reason
    for p in TF_FILES:
        for line in p.read_text().splitlines():
            if "checkov:skip=" in line:
                assert re.search(r"checkov:skip=[A-Z0-9_]+:\S.{15,}", line), f"{p}: unjustified {line.strip()}"


def test_terraform_fmt_if_available():
    tf = shutil.which("terraform")
    if not tf:
        pytest.skip("terraform is not installed: fmt/validate not run")
    r = subprocess.run([tf, "fmt", "-check", "-recursive", "-diff", str(cm.TF_ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("example", ["single-vm-numa", "multi-vm"])
def test_terraform_validate_if_providers_available(example, tmp_path):
    tf = shutil.which("terraform")
    if not tf:
        pytest.skip("terraform is not installed: validate not run")
    root = tmp_path / "terraform"
    shutil.copytree(cm.TF_ROOT, root, ignore=shutil.ignore_patterns(".terraform", "tests"))
    d = root / "examples" / example
    init = subprocess.run([tf, "init", "-backend=false", "-input=false", "-no-color"], cwd=d,
                          capture_output=True, text=True, timeout=300)
    if init.returncode != 0:
        pytest.skip("terraform init could not fetch the azurerm/random/tls providers (no registry access): validate not run")
    r = subprocess.run([tf, "validate", "-no-color"], cwd=d, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_atlas_commands_use_real_flags():
    text = (cm.TF_ROOT / "README.md").read_text().replace("\\\n", " ")
    cmds = [l.strip() for l in text.splitlines() if l.strip().startswith("nightshift-atlas ")]
    subs = {c.split()[1] for c in cmds}
    assert {"plan", "report"} <= subs
    for cmd in cmds:
        argv = cmd.split()
        spec = cm.binary_help("nightshift-atlas", argv[1])
        seen = set()
        for tok in argv[2:]:
            if tok.startswith("--"):
                assert tok[2:] in spec["flags"], f"README: nightshift-atlas {argv[1]} has no {tok}"
                seen.add(tok[2:])
        assert spec["required"] <= seen, f"README: {cmd} lacks {spec['required'] - seen}"


def test_renderer_matches_terraform_templatefile(tmp_path):
    """When terraform is installed: render every template with the same sample variables through
    terraform's own templatefile() (a provider-less config, so no download) and compare."""
    tf = shutil.which("terraform")
    if not tf:
        pytest.skip("terraform is not installed: renderer cross-check not run")
    import json
    cm.RENDERED.clear()
    for layout in LAYOUTS:
        for _, over in SETTINGS:
            cm.cloud_init(layout, cm.sample_settings(**over))
    cases = {}
    for name, variables, out in cm.RENDERED:
        cases.setdefault(json.dumps([name, variables], sort_keys=True), (name, variables, out))
    outputs = []
    for i, (name, variables, _) in enumerate(cases.values()):
        (tmp_path / f"v{i}.json").write_text(json.dumps(variables))
        outputs.append(f'output "r{i}" {{\n  value = templatefile("{cm.TEMPLATES / name}", '
                       f'jsondecode(file("${{path.module}}/v{i}.json")))\n}}\n')
    (tmp_path / "main.tf").write_text("".join(outputs))
    env = {**__import__("os").environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    for cmd in (["init", "-input=false", "-no-color"], ["apply", "-auto-approve", "-input=false", "-no-color"]):
        r = subprocess.run([tf, *cmd], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([tf, "output", "-json"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    got = json.loads(r.stdout)
    assert len(got) == len(cases) >= 10
    for i, (name, _, ours) in enumerate(cases.values()):
        assert got[f"r{i}"]["value"] == ours, f"{name}: our renderer differs from terraform's templatefile"


def test_custom_data_fits_azure_limit_at_64_nodes():
    # Azure accepts at most 64 KiB of base64 custom_data; the placement grows with the nodes.
    hosts = [f"10.42.1.{10 + i}" for i in range(64)]
    docs = cm.cloud_init("multi-vm", cm.sample_settings(node_count=64, subnet_hosts=hosts))
    biggest = max(len(base64.b64encode(d.encode())) for d in docs.values())
    assert biggest < 64 * 1024, f"custom_data is {biggest} bytes of base64"


def test_single_vm_coordinator_starts_after_its_nodes():
    s = cm.sample_settings()
    single = dict((p, c) for p, _, c in cm.vm_files("single-vm", s)["main"])["/etc/systemd/system/nightshift.service"]
    multi = dict((p, c) for p, _, c in cm.vm_files("multi-vm", s)["coord"])["/etc/systemd/system/nightshift.service"]
    after = next(l for l in single.splitlines() if l.startswith("After="))
    assert after.endswith("nightshift-expert-node@0.service nightshift-expert-node@1.service")
    assert "nightshift-expert-node" not in multi
