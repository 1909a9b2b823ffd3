"""Helpers of the terraform tests: the module's template composition mirrored in Python (which
template gets which variables, per layout and VM; the names match cloudinit.tf, and
test_templatefile_calls_pass_exactly_the_template_variables keeps the two in step), the parsing
of our binaries' real `--help`, and the check of a systemd ExecStart command line against it.
"""

import base64
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import tftemplate

TF_ROOT = Path(__file__).resolve().parent.parent
REPO = TF_ROOT.parent
MODULE = TF_ROOT / "modules" / "cluster"
TEMPLATES = MODULE / "templates"


def template(name):
    return (TEMPLATES / name).read_text()


RENDERED = []  # (template name, variables, output) of every render, for the terraform cross-check


def render(name, variables):
    out = tftemplate.render(template(name), variables)
    RENDERED.append((name, variables, out))
    return out


def sample_settings(**over):
    """Paths and settings as cloudinit.tf's locals set them (over = test overrides)."""
    s = dict(
        bin_dir="/usr/local/bin",
        model_dir="/models",
        state_dir="/var/lib/nightshift",
        placement_path="/etc/nightshift/placement.toml",
        nodes_path="/etc/nightshift/nodes.toml",
        node_token_path="/etc/nightshift/node-token",
        api_key_env_file="/etc/nightshift/api-key.env",
        prepare_path="/usr/local/lib/nightshift/prepare.sh",
        model_files=["Kimi-K2-Instruct-Q4_K_M-00001-of-00013.gguf", "Kimi-K2-Instruct-Q4_K_M-00002-of-00013.gguf"],
        model_name="kimi-k2",
        gateway_host="0.0.0.0",
        gateway_port=8080,
        node_port=50051,
        node_port_prefix="5005",
        numa_nodes=2,
        node_count=3,
        subnet_hosts=["10.42.1.10", "10.42.1.11", "10.42.1.12"],
        node_memory_bytes=0,
        node_threads=0,
        coordinator_threads=0,
        record_atlas=False,
        expert_deadline_ms=10000,
        max_seqs=8,
        ctx=4096,
        release_url="https://example.invalid/nightshift-aarch64.tar.gz",
        release_sha256="",
        model_blob_url="https://example.invalid/models/kimi-k2",
        tls_enabled=True,
        tls_mutual=True,
        tls_loopback=False,
        tls_dir="/etc/nightshift/tls",
    )
    s.update(over)
    s.setdefault("model_path", f"{s['model_dir']}/{s['model_files'][0]}")
    d = s["tls_dir"]
    s.setdefault("tls_ca_path", f"{d}/ca.pem")
    s.setdefault("tls_node_cert_path", f"{d}/node.pem")
    s.setdefault("tls_node_key_path", f"{d}/node-key.pem")
    s.setdefault("tls_client_cert_path", f"{d}/coordinator.pem")
    s.setdefault("tls_client_key_path", f"{d}/coordinator-key.pem")
    return s


def tls_on(layout, s):
    """local.tls_on: TLS on the multi-VM layout when enabled; on loopback only with tls_loopback."""
    return s["tls_enabled"] and (layout != "single-vm" or s["tls_loopback"])


def tls_mutual(layout, s):
    return tls_on(layout, s) and s["tls_mutual"]


def tls_files(layout, s, coordinator, serves_nodes):
    """local.tls_files[vm]: (bundle field, path, mode) the prepare script writes."""
    if not tls_on(layout, s):
        return []
    out = [dict(field="ca", path=s["tls_ca_path"], mode="0644")] if coordinator or tls_mutual(layout, s) else []
    if serves_nodes:
        out += [dict(field="node_cert", path=s["tls_node_cert_path"], mode="0644"),
                dict(field="node_key", path=s["tls_node_key_path"], mode="0600")]
    if coordinator and tls_mutual(layout, s):
        out += [dict(field="client_cert", path=s["tls_client_cert_path"], mode="0644"),
                dict(field="client_key", path=s["tls_client_key_path"], mode="0600")]
    return out


def tls_sans(layout, s, name="nightshift"):
    """local.tls_node_vms: vm key -> (ip_addresses, dns_names) of its server certificate."""
    if not tls_on(layout, s):
        return {}
    if layout == "single-vm":
        return {"main": (["127.0.0.1"], [f"{name}-main", "localhost"] + [n["name"] for n in cluster_nodes(layout, s)])}
    return {f"node{i}": ([s["subnet_hosts"][i]], [f"{name}-node{i}", f"node{i}"]) for i in range(s["node_count"])}


def cluster_nodes(layout, s):
    if layout == "single-vm":
        return [
            dict(name=f"numa{i}", addr=f"127.0.0.1:{s['node_port_prefix']}{i}", has_numa=True, numa=i,
                 memory_bytes=s["node_memory_bytes"])
            for i in range(s["numa_nodes"])
        ]
    return [
        dict(name=f"node{i}", addr=f"{s['subnet_hosts'][i]}:{s['node_port']}", has_numa=False, numa=0,
             memory_bytes=s["node_memory_bytes"])
        for i in range(s["node_count"])
    ]


def coordinator_unit(s):
    return render("nightshift.service.tftpl", dict(
        bin_dir=s["bin_dir"], model_path=s["model_path"], model_dir=s["model_dir"],
        model_name=s["model_name"], placement_path=s["placement_path"],
        gateway_host=s["gateway_host"], gateway_port=s["gateway_port"],
        node_token_path=s["node_token_path"], api_key_env_file=s["api_key_env_file"],
        state_dir=s["state_dir"], expert_deadline_ms=s["expert_deadline_ms"],
        max_seqs=s["max_seqs"], ctx=s["ctx"], set_threads=s["coordinator_threads"] > 0,
        coordinator_threads=s["coordinator_threads"], record_atlas=s["record_atlas"],
        single_vm=s["layout"] == "single-vm",
        local_node_units=" ".join(f"nightshift-expert-node@{i}.service" for i in range(s["numa_nodes"])),
        tls=tls_on(s["layout"], s), tls_mutual=tls_mutual(s["layout"], s), tls_ca_path=s["tls_ca_path"],
        tls_client_cert=s["tls_client_cert_path"], tls_client_key=s["tls_client_key_path"]))


def numa_node_unit(s):
    return render("nightshift-expert-node@.service.tftpl", dict(
        bin_dir=s["bin_dir"], model_path=s["model_path"], model_dir=s["model_dir"],
        placement_path=s["placement_path"], node_port_prefix=s["node_port_prefix"],
        node_token_path=s["node_token_path"], set_threads=s["node_threads"] > 0,
        node_threads=s["node_threads"], **_node_tls("single-vm", s)))


def _node_tls(layout, s):
    return dict(tls=tls_on(layout, s), tls_mutual=tls_mutual(layout, s), tls_ca_path=s["tls_ca_path"],
                tls_node_cert=s["tls_node_cert_path"], tls_node_key=s["tls_node_key_path"])


def vm_node_unit(s, node_name):
    return render("nightshift-expert-node.service.tftpl", dict(
        bin_dir=s["bin_dir"], model_path=s["model_path"], model_dir=s["model_dir"],
        placement_path=s["placement_path"], node_name=node_name, node_port=s["node_port"],
        link_port=s["node_port"] + 1, node_token_path=s["node_token_path"], set_threads=s["node_threads"] > 0,
        node_threads=s["node_threads"], **_node_tls("multi-vm", s)))


def vms(layout, s):
    """key -> (role, coordinator, node_name), as local.vms."""
    if layout == "single-vm":
        return {"main": ("single-vm", True, "")}
    out = {"coord": ("coordinator", True, "")}
    for i in range(s["node_count"]):
        out[f"node{i}"] = ("expert-node", False, f"node{i}")
    return out


def vm_files(layout, s):
    """key -> list of (path, permissions, content), as local.vm_files."""
    nodes = cluster_nodes(layout, s)
    placement = render("placement.toml.tftpl", {"nodes": nodes})
    nodes_toml = render("nodes.toml.tftpl", {"nodes": nodes})
    out = {}
    for key, (role, coord, node_name) in vms(layout, s).items():
        units = (["nightshift.service"] if coord else []) + (
            [f"nightshift-expert-node@{i}.service" for i in range(s["numa_nodes"])] if layout == "single-vm" else []
        ) + (["nightshift-expert-node.service"] if layout != "single-vm" and not coord else [])
        files = [
            (s["placement_path"], "0644", placement),
            (s["nodes_path"], "0644", nodes_toml),
            ("/etc/systemd/system/nightshift-prepare.service", "0644",
             render("nightshift-prepare.service.tftpl", {"script_path": s["prepare_path"]})),
            (s["prepare_path"], "0755", render("nightshift-prepare.sh.tftpl", dict(
                bin_dir=s["bin_dir"], model_dir=s["model_dir"], state_dir=s["state_dir"],
                release_url=s["release_url"], release_sha256=s["release_sha256"],
                model_blob_url=s["model_blob_url"], model_files=s["model_files"],
                identity_client_id="11111111-2222-3333-4444-555555555555",
                key_vault_uri="https://nightshiftkvabcde.vault.azure.net",
                node_token_secret_name="nightshift-node-token",
                api_key_secret_name="nightshift-api-key", node_token_path=s["node_token_path"],
                api_key_env_file=s["api_key_env_file"], is_coordinator=coord,
                tls=tls_on(layout, s), tls_dir=s["tls_dir"],
                tls_secret_name=f"nightshift-tls-{key}" if tls_on(layout, s) else "",
                tls_files=tls_files(layout, s, coord, layout == "single-vm" or not coord)))),
            ("/etc/systemd/system/nightshift-cluster.target", "0644",
             render("nightshift-cluster.target.tftpl", {"role": role, "wants": " ".join(units)})),
        ]
        if coord:
            files.append(("/etc/systemd/system/nightshift.service", "0644", coordinator_unit({**s, "layout": layout})))
        if layout == "single-vm":
            files.append(("/etc/systemd/system/nightshift-expert-node@.service", "0644", numa_node_unit(s)))
        if layout != "single-vm" and not coord:
            files.append(("/etc/systemd/system/nightshift-expert-node.service", "0644", vm_node_unit(s, node_name)))
        out[key] = files
    return out


def cloud_init(layout, s):
    """key -> rendered cloud-init document, as local.custom_data."""
    out = {}
    for key, files in vm_files(layout, s).items():
        out[key] = render("cloud-init.yaml.tftpl", dict(
            role=vms(layout, s)[key][0],
            files=[dict(path=p, permissions=m, content_b64=base64.b64encode(c.encode()).decode()) for p, m, c in files],
            enable_units=["nightshift-prepare.service", "nightshift-cluster.target"]))
    return out


# ---- the binaries' real command-line interface ----

def bin_dir():
    d = Path(os.environ.get("NIGHTSHIFT_BIN_DIR", REPO / "target" / "debug"))
    return d if d.is_absolute() else (REPO / d).resolve()


_OPT = re.compile(r"^\s+(?:-[A-Za-z], )?--([a-z0-9][a-z0-9-]*)(?: <([A-Z_]+)>)?")


def parse_help(text):
    """{'flags': {name: takes_value}, 'required': set(names)} from clap's --help output."""
    flags = {}
    for line in text.splitlines():
        m = _OPT.match(line)
        if m:
            flags[m.group(1)] = m.group(2) is not None
    usage = next((l for l in text.splitlines() if l.startswith("Usage:")), "")
    required = set(re.findall(r"(?<!\[)--([a-z0-9-]+) <", usage))
    if not flags:
        raise AssertionError(f"no flags found in --help output:\n{text}")
    return {"flags": flags, "required": required}


def binary_help(name, *sub):
    exe = bin_dir() / name
    if not exe.exists():
        raise AssertionError(f"expected the binary {exe} (build it: cargo build -p nightshift-coordinator -p nightshift-expert-node)")
    out = subprocess.run([str(exe), *sub, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError(f"{exe} {' '.join(sub)} --help exited {out.returncode}: {out.stderr}")
    return parse_help(out.stdout)


def exec_starts(unit_text):
    """ExecStart= values of a unit (continuation lines joined)."""
    text = unit_text.replace("\\\n", " ")
    return [l.split("=", 1)[1].strip() for l in text.splitlines() if l.startswith("ExecStart=")]


def systemd_argv(cmd, instance=None):
    """argv of an ExecStart line with the specifiers we use expanded (%i, %%)."""
    argv = shlex.split(cmd)
    out = []
    for a in argv:
        if "%" in a:
            if instance is None and "%i" in a:
                raise AssertionError(f"%i in a non-template unit: {cmd}")
            a = a.replace("%i", str(instance)).replace("%%", "%")
            if "%" in a:
                raise AssertionError(f"unexpected systemd specifier in {a!r}")
        out.append(a)
    return out


def check_argv(argv, helps):
    """Problems of argv against the binaries' --help (empty list = fine). helps maps
    'nightshift-expert-node' and 'nightshift serve' to parse_help results."""
    name = Path(argv[0]).name
    rest = argv[1:]
    if name == "nightshift":
        if not rest or rest[0] != "serve":
            return [f"expected `nightshift serve ...`, found {argv}"]
        key, rest = "nightshift serve", rest[1:]
    else:
        key = name
    if key not in helps:
        return [f"unknown binary {name}"]
    spec = helps[key]
    problems, seen = [], set()
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--"):
            problems.append(f"{key}: unexpected positional argument {tok!r}")
            i += 1
            continue
        flag = tok[2:].split("=", 1)[0]
        if flag not in spec["flags"]:
            problems.append(f"{key}: unknown flag --{flag} (known: {sorted(spec['flags'])})")
            i += 1
            continue
        if flag in seen:
            problems.append(f"{key}: --{flag} given twice")
        seen.add(flag)
        if spec["flags"][flag] and "=" not in tok:
            if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
                problems.append(f"{key}: --{flag} expects a value, found none")
            i += 2
        else:
            i += 1
    for r in spec["required"] - seen:
        problems.append(f"{key}: required flag --{r} missing")
    return problems


# ---- the prepare script's TLS step, run locally ----

def run_prepare_tls_step(script, bundle, work):
    """Runs the TLS step of a rendered prepare script with Key Vault (`secret` returns `bundle`,
    the JSON secret of this VM), `install -d` and `chown` stubbed (chown calls are logged to
    work/chown.log); returns the CompletedProcess."""
    step = script[script.index("# 4. TLS PEMs"):script.index('log "ready"')]
    work = Path(work)
    (work / "bundle.json").write_text(json.dumps(bundle))
    stubs = (f"set -euo pipefail\numask 077\n"
             f'secret() {{ case "$1" in nightshift-tls-*) cat "{work}/bundle.json";; *) return 1;; esac; }}\n'
             f'install() {{ mkdir -p "${{@: -1}}"; }}\n'
             f'chown() {{ echo "$*" >> "{work}/chown.log"; }}\n')
    return subprocess.run(["bash", "-c", stubs + step], capture_output=True, text=True)


def make_pki(work, node_ips, node_dns, client_dns, client_ips):
    """A CA, a node certificate and a coordinator client certificate made with the openssl CLI the
    way tls.tf makes them (ECDSA P-256, PKCS#8 keys, SANs, server_auth / client_auth): the JSON
    bundle the module stores in Key Vault for a VM that is both coordinator and node."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)

    def ossl(*args):
        r = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=work)
        if r.returncode != 0:
            raise AssertionError(f"openssl {' '.join(args)}: {r.stderr}")

    for k in ("ca", "node", "client"):
        ossl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{k}-key.pem")
    ossl("req", "-x509", "-new", "-key", "ca-key.pem", "-subj", "/O=NightShift/CN=stand-in cluster CA",
         "-days", "2", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", "ca.pem")
    leafs = {"node": (node_ips, node_dns, "serverAuth", "digitalSignature,keyEncipherment"),
             "client": (client_ips, client_dns, "clientAuth", "digitalSignature")}
    for i, (k, (ips, dns, eku, ku)) in enumerate(leafs.items()):
        san = ",".join([f"IP:{a}" for a in ips] + [f"DNS:{d}" for d in dns])
        (work / f"{k}.ext").write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,{ku}\n"
                                       f"extendedKeyUsage={eku}\nsubjectAltName={san}\n")
        ossl("req", "-new", "-key", f"{k}-key.pem", "-subj", f"/O=NightShift/CN={k}", "-out", f"{k}.csr")
        ossl("x509", "-req", "-in", f"{k}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-set_serial",
             str(100 + i), "-days", "2", "-extfile", f"{k}.ext", "-out", f"{k}.pem")
    pem = lambda n: (work / n).read_text()  # noqa: E731
    return {"ca": pem("ca.pem"), "node_cert": pem("node.pem"), "node_key": pem("node-key.pem"),
            "client_cert": pem("client.pem"), "client_key": pem("client-key.pem")}
