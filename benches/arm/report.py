#!/usr/bin/env python3
"""Arm performance evidence without Arm hardware (driven by benches/arm/run.sh).

For every (type, path, batch) it runs one GEMM under qemu-aarch64 with the execution log on
(`-d in_asm,exec,nochain`), cuts out the instructions executed between the harness's
`trace_begin` and `trace_end` markers, and derives two independent figures from that exact
dynamic instruction stream:

1. its length: the dynamic instruction count (qemu's `libinsn.so` plugin is not shipped by
   Debian's qemu-user, so the count comes from the translation-block log instead: every
   executed block is logged with `nochain`, and its instructions are known from `in_asm`);
2. `llvm-mca`'s cycle prediction for that stream on the Neoverse N2 and V2 scheduling models,
   with its bottleneck analysis.

Both are normalised per 256 weights per activation row. Then it writes the Markdown report:
ours vs ggml, GFLOP/s per core at the VMs' clocks, and a roofline per VM.
"""

import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

# Type groups (`--types` / ARM_TYPES takes type names or these group names).
GROUPS = {
    "kquants": ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"],
    "legacy": ["q8_0", "q4_0", "q5_0", "q4_1", "q5_1"],
    "iq": ["iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_nl",
           "iq4_xs", "tq1_0", "tq2_0"],
    "fp4": ["mxfp4", "nvfp4", "q1_0", "q2_0"],
}
GROUPS["all"] = [t for g in ("kquants", "legacy", "iq", "fp4") for t in GROUPS[g]]
TYPES = list(GROUPS["all"])
TIERS = ["neon", "dotprod", "i8mm"]
BATCHES = [1, 2, 4, 8]
CPUS = {"n2": "neoverse-n2", "v2": "neoverse-v2"}
# ggml's paths per type (see ggml_trace.c): the plain dot everywhere, SMMLA dots where
# quants.c has an nrc == 2 branch, interleaved ("repack") kernels where ggml-cpu's repack.cpp
# picks one for a CPU with NEON, dotprod and i8mm (IQ4_NL/MXFP4 4x4, Q1_0 4x8, ...).
GGML_MMLA = {"q4_k", "q6_k", "q8_0", "q4_0", "q4_1"}
GGML_REPACK = {"q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "iq4_nl", "mxfp4", "q1_0"}
# Bytes per block and elements per block (ggml-common.h): bits per weight = bytes * 8 / len.
BLOCKS = {"q2_k": (84, 256), "q3_k": (110, 256), "q4_k": (144, 256), "q5_k": (176, 256),
          "q6_k": (210, 256), "q8_0": (34, 32), "q4_0": (18, 32), "q5_0": (22, 32),
          "q4_1": (20, 32), "q5_1": (24, 32), "iq1_s": (50, 256), "iq1_m": (56, 256),
          "iq2_xxs": (66, 256), "iq2_xs": (74, 256), "iq2_s": (82, 256), "iq3_xxs": (98, 256),
          "iq3_s": (110, 256), "iq4_nl": (18, 32), "iq4_xs": (136, 256), "tq1_0": (54, 256),
          "tq2_0": (66, 256), "mxfp4": (17, 32), "nvfp4": (36, 64), "q1_0": (18, 128),
          "q2_0": (18, 64)}
BPW = {t: b * 8 / n for t, (b, n) in BLOCKS.items()}

# The VMs: clock, cores, memory bandwidth, with sources (see the report's VM table).
VMS = [
    {"name": "Azure Cobalt 100 (Dpsv6, Neoverse N2)", "cpu": "n2", "ghz": 3.4, "cores": 128,
     "vcpus": [16, 96], "socket_gbs": 12 * 5600 * 8 / 1000,
     "src": "3.4 GHz and Neoverse N2: Microsoft Learn, Dpsv6 sizes series page "
            "(learn.microsoft.com/azure/virtual-machines/sizes/general-purpose/dpsv6-series); "
            "128 cores, 12 DDR5 channels: Microsoft's Cobalt 100 announcements (Ignite 2023, "
            "Hot Chips 2024); DDR5-5600 per channel is an assumption (not published)"},
    {"name": "AWS Graviton 4 (m8g/c8g, Neoverse V2)", "cpu": "v2", "ghz": 2.8, "cores": 96,
     "vcpus": [16, 96], "socket_gbs": 12 * 5600 * 8 / 1000,
     "src": "96 cores, 12 x DDR5-5600 = 536.7 GB/s: AnandTech, 'Amazon Unveils Graviton4: A "
            "96-Core ARM CPU with 536.7 GBps Memory Bandwidth' (2023-11-29); 2.8 GHz: "
            "WikiChip, annapurna_labs/graviton/graviton4, and AWS's m8g instance page"},
]
# Active parameters per decoded token (weights read once per token at batch 1).
MODELS = [("Kimi K2 (32B active)", 32.0e9), ("Qwen3-30B-A3B (3.3B active)", 3.3e9)]


def parse_trace(log_path, begin, end):
    """The instruction words executed strictly between the TBs at `begin` and `end`."""
    tbs = {}
    words = []
    cur = None
    state = 0  # 0: before begin, 1: recording, 2: done
    with open(log_path, errors="replace") as f:
        for line in f:
            if line.startswith("IN:"):
                cur = None
                continue
            if line.startswith("0x"):
                m = re.match(r"0x([0-9a-f]+):\s+([0-9a-f]{8})\s", line)
                if m:
                    pc = int(m.group(1), 16)
                    if cur is None:
                        cur = tbs[pc] = []
                    cur.append(int(m.group(2), 16))
                continue
            cur = None
            if line.startswith("Trace "):
                m = re.search(r"\[[0-9a-f]+/([0-9a-f]+)/", line)
                if not m:
                    continue
                pc = int(m.group(1), 16)
                if state == 0:
                    if pc == begin:
                        state = 1
                elif state == 1:
                    if pc == end:
                        state = 2
                        break
                    words.extend(tbs[pc])
    if state != 2:
        raise RuntimeError(f"{log_path}: markers not found in the trace (state {state})")
    return words


def qemu_trace(cmd, workdir):
    """Runs `cmd` (an aarch64 binary and its arguments) under qemu with the TB log; returns
    the executed instruction words between the markers."""
    fd, log = tempfile.mkstemp(suffix=".log", dir=workdir)
    os.close(fd)
    try:
        qemu = ["qemu-aarch64", "-cpu", "max,sve-default-vector-length=16",
                "-L", "/usr/aarch64-linux-gnu", "-d", "in_asm,exec,nochain", "-D", log]
        out = subprocess.run(qemu + cmd, check=True, capture_output=True, text=True).stdout
        m = re.search(r"trace_begin=(0x[0-9a-f]+) trace_end=(0x[0-9a-f]+)", out)
        if not m:
            raise RuntimeError(f"{cmd}: no marker addresses in its output")
        return parse_trace(log, int(m.group(1), 16), int(m.group(2), 16))
    finally:
        os.unlink(log)


class Disasm:
    """Instruction words -> assembly text (llvm-mc), cached."""

    ATTRS = "+v9a,+sve2,+i8mm,+dotprod,+fullfp16,+bf16,+crc,+lse,+rcpc"

    def __init__(self, mc):
        self.mc = mc
        self.text = {}

    def _run(self, words):
        src = "".join(" ".join(f"0x{(w >> (8 * i)) & 0xff:02x}" for i in range(4)) + "\n"
                      for w in words)
        r = subprocess.run([self.mc, "--disassemble", "-triple=aarch64", f"-mattr={self.ATTRS}"],
                           input=src, capture_output=True, text=True)
        return [l.strip() for l in r.stdout.splitlines()
                if l.strip() and not l.strip().startswith(".")]

    def add(self, words):
        new = sorted(set(words) - self.text.keys())
        if not new:
            return
        lines = self._run(new)
        if len(lines) != len(new):
            lines = [(self._run([w]) or [f"// undecodable {w:#010x}"])[0] for w in new]
        for w, t in zip(new, lines):
            self.text[w] = mca_safe(t)


def mca_safe(t):
    """llvm-mca gives calls a fixed 100-cycle latency (their target is not modelled): a call
    in a trace is followed by its callee's instructions anyway, so it is modelled as the
    one-cycle write of the link register it also is."""
    op = t.split()[0]
    if op in ("bl", "blr", "blraa", "blraaz", "blrab", "blrabz"):
        return "adr\tx30, #0"
    return t


def mca(mca_bin, cpu, asm_lines, workdir):
    fd, path = tempfile.mkstemp(suffix=".s", dir=workdir)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(asm_lines) + "\n")
    try:
        r = subprocess.run([mca_bin, "-mtriple=aarch64", f"-mcpu={cpu}", "-iterations=1",
                            "-bottleneck-analysis", "-instruction-info=0", path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"llvm-mca failed: {r.stderr[:2000]}")
        out = r.stdout
    finally:
        os.unlink(path)
    cycles = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1))
    # Resource names and the aggregated pressure line.
    names = re.findall(r"^\[(\d+(?:\.\d+)?)\]\s+-\s+(\S+)", out, re.M)
    m = re.search(r"Resource pressure per iteration:\n(.*)\n(.*)\n", out)
    top = ("?", 0.0)
    if m and names:
        vals = [float(v) if v != "-" else 0.0 for v in m.group(2).split()]
        pressure = collections.defaultdict(float)
        for (_, name), v in zip(names, vals):
            pressure[name] = max(pressure[name], v)
        name, v = max(pressure.items(), key=lambda kv: kv[1])
        top = (name, v / cycles)
    bn = {}
    for key, pat in (("backend", r"Cycles with backend pressure increase \[\s*([\d.]+)%"),
                     ("resource", r"Resource Pressure\s+\[\s*([\d.]+)%"),
                     ("data", r"Data Dependencies:\s+\[\s*([\d.]+)%")):
        mm = re.search(pat, out)
        bn[key] = float(mm.group(1)) if mm else 0.0
    return {"cycles": cycles, "top": top[0], "top_util": top[1], **bn}


def bottleneck(r):
    """One short phrase: the most used pipe and what holds the back end."""
    kind = "deps" if r["data"] > r["resource"] else "pipes"
    return f"{short(r['top'])} {100 * r['top_util']:.0f}% ({kind})"


def short(resource):
    return re.sub(r"^(N2|V2)Unit", "", resource)


def batches_for(args, ty):
    """The batches traced for `ty`: `--batches`, or by default 1, 2, 4, 8 for the K-quants,
    Q8_0 and Q4_0 and 1, 4 for the other types (keeps the default run near 15 minutes)."""
    if args.batches != "auto":
        return [int(b) for b in args.batches.split(",") if b]
    return [1, 2, 4, 8] if ty in GROUPS["kquants"] + ["q8_0", "q4_0"] else [1, 4]


def collect(args):
    work = tempfile.mkdtemp(prefix="nightshift-arm-")
    dis = Disasm(args.llvm_mc)
    jobs = []
    for ty in TYPES:
        for b in batches_for(args, ty):
            for tier in TIERS:
                jobs.append((("ours", tier, ty, b, "any"),
                             [args.ours, ty, tier, str(args.k), str(args.rows), str(b)]))
            if args.ours_only:
                continue
            for cpu in CPUS:
                paths = ["dot"] + (["mmla"] if ty in GGML_MMLA and b % 2 == 0 else []) + \
                        (["repack"] if ty in GGML_REPACK else [])
                for p in paths:
                    jobs.append((("ggml", p, ty, b, cpu),
                                 [args.ggml[cpu], p, ty, str(args.k), str(args.rows), str(b)]))
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        traces = list(ex.map(lambda j: qemu_trace(j[1], work), jobs))
        for t in traces:
            dis.add(t)

        def analyse(item):
            (key, _), words = item
            asm = [dis.text[w] for w in words]
            cpus = ([c for c in CPUS][:1] if args.ours_only else list(CPUS)) \
                if key[4] == "any" else [key[4]]
            return [(key, cpu, len(words), mca(args.llvm_mca, CPUS[cpu], asm, work))
                    for cpu in cpus]

        for rs in ex.map(analyse, zip(jobs, traces)):
            results.extend(rs)
            key = rs[0][0]
            print(f"  {' '.join(map(str, key[:4]))}: {rs[0][2]} instructions, "
                  + ", ".join(f"{cpu} {r['cycles']} cycles" for _, cpu, _, r in rs),
                  file=sys.stderr)
    os.rmdir(work)
    rows = []
    for (who, path, ty, b, _), cpu, n, r in results:
        units = args.rows * (args.k // 256) * b  # 256-weight blocks x activation rows
        rows.append({"who": who, "path": path, "type": ty, "batch": b, "cpu": cpu,
                     "insns": n / units, "cycles": r["cycles"] / units, "mca": r})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", required=True, help="the arm_trace example (aarch64 binary)")
    ap.add_argument("--ggml-n2", required=True, help="ggml_trace built for neoverse-n2")
    ap.add_argument("--ggml-v2", required=True, help="ggml_trace built for neoverse-v2")
    ap.add_argument("--llvm-mca", default="llvm-mca-19")
    ap.add_argument("--llvm-mc", default="llvm-mc-19")
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--types", default="all",
                    help="comma-separated types or groups (" + ", ".join(GROUPS) + ")")
    ap.add_argument("--batches", default="auto",
                    help="comma-separated batches for every type (default: see batches_for)")
    ap.add_argument("--ours-only", action="store_true",
                    help="trace nightshift only (for a baseline file; writes no report)")
    ap.add_argument("--json", required=True, help="raw results (JSON)")
    ap.add_argument("--out", required=True, help="the Markdown report")
    ap.add_argument("--meta", default="", help="one line about the build (versions)")
    ap.add_argument("--baseline", action="append", default=[],
                    help="an earlier run's figures to compare with (JSON; repeatable)")
    args = ap.parse_args()
    args.ggml = {"n2": args.ggml_n2, "v2": args.ggml_v2}
    TYPES[:] = [t for name in args.types.split(",") if name
                 for t in GROUPS.get(name, [name])]
    unknown = [t for t in TYPES if t not in BLOCKS]
    if unknown:
        ap.error(f"unknown types {unknown} (groups: {', '.join(GROUPS)})")
    BATCHES[:] = sorted({b for t in TYPES for b in batches_for(args, t)})
    import render  # noqa: E402  (same directory)
    args.baselines = [render.load_baseline(b) for b in args.baseline]
    rows = collect(args)
    with open(args.json, "w") as f:
        json.dump({"k": args.k, "rows": args.rows, "meta": args.meta, "results": rows}, f,
                  indent=1)
    if args.ours_only:
        print(f"wrote {args.json}", file=sys.stderr)
        return
    with open(args.out, "w") as f:
        f.write(render.report(rows, args, VMS, MODELS, BPW, TYPES, BATCHES, CPUS))
    print(f"wrote {args.out} and {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
