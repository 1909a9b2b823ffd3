"""Local stand-in for the single-VM multi-NUMA layout: renders the module's templates for two
NUMA nodes with local paths (binaries from target/, the tiny qwen3moe fixture as the model, free
loopback ports), runs exactly the ExecStart command lines systemd would run (%i expanded, the
coordinator's EnvironmentFile loaded), and sends one chat completion through the gateway.
A `--numa N` whose NUMA node this machine lacks is dropped, with a note (the flag itself is
checked against --help by test_static). Runs twice: plaintext (the default) and with tls_loopback
(mutual TLS: openssl-made certificates with the names tls.tf gives, placed by the rendered prepare
script's TLS step). Every process is killed at the end.
"""

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_model as cm  # noqa: E402

MODEL = cm.REPO / "model" / "tests" / "data" / "tiny-qwen3moe-Q2_K.gguf"


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_prefix(numa_nodes):
    """A node_port_prefix P such that ports P0..P(n-1) are free on loopback."""
    for _ in range(200):
        p = random.randint(2000, 6499)
        if all(port_free(int(f"{p}{i}")) for i in range(numa_nodes)):
            return str(p)
    raise AssertionError("found no free node_port_prefix")


def env_file(path):
    env = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    return env


def request(url, body=None, key=None, timeout=120):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "mutual-tls"])
def test_rendered_single_vm_units_serve_a_chat_completion(tmp_path, tls):
    assert MODEL.exists(), f"expected the fixture {MODEL}"
    if tls and not (shutil.which("openssl") and shutil.which("jq")):
        pytest.skip("openssl or jq is not installed: the TLS stand-in needs them (certificates, prepare step)")
    numa_nodes = 2
    key = f"standin-{random.randint(0, 10**9)}"
    s = cm.sample_settings(
        bin_dir=str(cm.bin_dir()), model_dir=str(MODEL.parent), model_files=[MODEL.name],
        model_name="standin", placement_path=str(tmp_path / "placement.toml"),
        node_token_path=str(tmp_path / "node-token"), api_key_env_file=str(tmp_path / "api-key.env"),
        state_dir=str(tmp_path / "state"), gateway_host="127.0.0.1", gateway_port=free_port(),
        node_port_prefix=free_prefix(numa_nodes), numa_nodes=numa_nodes, ctx=512, node_threads=1,
        coordinator_threads=1, expert_deadline_ms=60000, tls_loopback=tls, tls_dir=str(tmp_path / "tls"))
    files = dict((p, c) for p, _, c in cm.vm_files("single-vm", s)["main"])
    if tls:
        # certificates as tls.tf issues them (the names of local.tls_node_vms), written by the
        # rendered prepare script's TLS step from the Key Vault bundle
        [(ips, names)] = cm.tls_sans("single-vm", s).values()
        bundle = cm.make_pki(tmp_path / "pki", ips, names, ["nightshift-main"], ["10.42.1.4"])
        r = cm.run_prepare_tls_step(files[s["prepare_path"]], bundle, tmp_path)
        assert r.returncode == 0, r.stderr
    Path(s["placement_path"]).write_text(files[s["placement_path"]])
    Path(s["node_token_path"]).write_text("standin-node-token\n")
    Path(s["api_key_env_file"]).write_text(f"NIGHTSHIFT_API_KEY={key}\n")  # what prepare.sh writes
    Path(s["state_dir"]).mkdir()

    node_unit = files["/etc/systemd/system/nightshift-expert-node@.service"]
    coord_unit = files["/etc/systemd/system/nightshift.service"]
    [node_cmd] = cm.exec_starts(node_unit)
    [coord_cmd] = cm.exec_starts(coord_unit)
    assert f"EnvironmentFile={s['api_key_env_file']}" in coord_unit

    procs, logs = [], []
    try:
        for i in range(numa_nodes):
            argv = cm.systemd_argv(node_cmd, i)
            if not Path(f"/sys/devices/system/node/node{i}").exists():
                j = argv.index("--numa")
                warnings.warn(f"this machine has no NUMA node {i}: numa{i} runs without `--numa {i}`")
                del argv[j:j + 2]
            log = open(tmp_path / f"numa{i}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))
        env = {**os.environ, **env_file(s["api_key_env_file"])}
        env.pop("RUST_LOG", None)
        log = open(tmp_path / "coordinator.log", "w")
        logs.append(log)
        coord = subprocess.Popen(cm.systemd_argv(coord_cmd), stdout=log, stderr=subprocess.STDOUT,
                                 cwd=s["state_dir"], env=env)
        procs.append(coord)

        base = f"http://127.0.0.1:{s['gateway_port']}"
        deadline = time.time() + 180
        ready = False
        while time.time() < deadline:
            dead = [p.args[0] for p in procs if p.poll() is not None]
            assert not dead, f"exited early: {dead}\n" + "\n".join(
                f"--- {f.name}\n{Path(f.name).read_text()[-3000:]}" for f in logs)
            try:
                if request(base + "/ready", timeout=2)[0] == 200:
                    ready = True
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        assert ready, "gateway never became ready:\n" + Path(tmp_path / "coordinator.log").read_text()[-3000:]

        body = {"model": "standin", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
                "temperature": 0}
        status, _ = request(base + "/v1/chat/completions", body, key=None)
        assert status == 401, f"without the key expected 401, found {status}"
        status, text = request(base + "/v1/chat/completions", body, key=key)
        assert status == 200, f"expected 200, found {status}: {text}"
        content = json.loads(text)["choices"][0]["message"]["content"]
        assert content, f"expected non-empty content, found {text}"
        print(f"stand-in completion: {content!r}")
        coord_log = re.sub(r"\x1b\[[0-9;]*m", "", (tmp_path / "coordinator.log").read_text())
        for i in range(numa_nodes):
            addr = f"127.0.0.1:{s['node_port_prefix']}{i}"
            assert f"numa{i} {addr} (up)" in coord_log, f"the coordinator did not dial numa{i} at {addr}"
            node_log = re.sub(r"\x1b\[[0-9;]*m", "", (tmp_path / f"numa{i}.log").read_text())
            assert (f"tls={str(tls).lower()}" in node_log and f"mtls={str(tls).lower()}" in node_log), node_log[-2000:]
        for p in procs:
            assert p.poll() is None, f"{p.args[0]} died while serving"
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
