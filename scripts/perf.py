#!/usr/bin/env python3
"""Start-up, verification and scaling of simple-ipc on a GPU host, measured in one run.

    scripts/perf.py [BINARY] [--runs N] [--floor IPC_FLOOR]     (default: target/release/simple-ipc, 5 runs)

Prints medians over N runs of: the CUDA start-up of one process (the floor: the parent's cuInit plus primary
context in the --sequential runs, where nothing else competes), the whole run in the default (overlapped) and
the original's sequential order, the copy back and the comparison of 64 MiB, and the wall time for
--procs-per-device 1, 2, 4, 8, 16; then the ratios that issue 4 sets targets for; then the --topology report
and the --bench table (hand-over latency and IPC copy bandwidth, 4 KiB to 1 GiB). Given the floor
(scripts/floor/ipc-floor.cu, built with nvcc as scripts/compare.sh builds it), it also prints the whole run
against the least program doing the same IPC work (`ipc-floor N`, one GPU visible, one connection each) for
N = 1 to 16.
"""
import json, os, statistics, subprocess, sys, tempfile, time

args = [a for a in sys.argv[1:]]
runs = 5
if "--runs" in args:
    i = args.index("--runs"); runs = int(args[i + 1]); del args[i:i + 2]
probe = None
if "--floor" in args:
    i = args.index("--floor"); probe = os.path.realpath(args[i + 1]); del args[i:i + 2]
binary = os.path.realpath(args[0] if args else "target/release/simple-ipc")
tmp = tempfile.mkdtemp()


def run(*extra, env=None):
    path = os.path.join(tmp, "t.json")
    start = time.perf_counter()
    out = subprocess.run([binary, "--json", path, *extra], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **(env or {})))
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{binary} {' '.join(extra)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    with open(path) as f:
        doc = json.load(f)  # docs/json.md
    assert doc["status"] == "passed", doc
    return wall * 1e3, doc["run"]


def phases(process):
    return process["phases"]


# simple-ipc asks for one hardware queue per context; CUDA's own default is 8 (what the original runs with).
CUDA_DEFAULT = {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
med = statistics.median
m = {k: [] for k in ("floor", "floor_cuda", "seq", "seq_cuda", "ovl", "copy", "compare", "child_ctx")}
for _ in range(runs):
    w, doc = run("--sequential")
    m["seq"].append(w)
    m["floor"].append(phases(doc["parent"])["cuda_start"] + phases(doc["parent"])["context"])
    w, doc = run("--sequential", env=CUDA_DEFAULT)
    m["seq_cuda"].append(w)
    m["floor_cuda"].append(phases(doc["parent"])["cuda_start"] + phases(doc["parent"])["context"])
    w, doc = run()
    m["ovl"].append(w)
    c = phases(doc["children"][0])
    m["copy"].append(c["copy_back"]); m["compare"].append(c["verify"]); m["child_ctx"].append(c["context"])
    assert "SIMPLE_IPC_SIMULATE_GPUS" in os.environ or doc["buffer_bytes"] == 64 << 20, doc
r = {k: med(v) for k, v in m.items()}

print(f"== simple-ipc performance: {binary}, medians of {runs} runs, ms")
rows = [
    ("CUDA start-up of one process (cuInit + context): floor", r["floor"]),
    ("  the same with CUDA's default 8 connections", r["floor_cuda"]),
    ("whole run, default (children overlap the parent)", r["ovl"]),
    ("whole run, --sequential (the original's order)", r["seq"]),
    ("whole run, --sequential with CUDA's default 8 connections", r["seq_cuda"]),
    ("  a child's context creation, default run", r["child_ctx"]),
    ("copy back of 64 MiB (pinned, pre-faulted)", r["copy"]),
    ("comparison of 64 MiB", r["compare"]),
]
for name, value in rows:
    print(f"{name:<60}{value:>9.2f}")
print(f"ratio default / floor                              = {r['ovl'] / r['floor']:.2f}  (target <= 1.5)")
print(f"ratio default / floor with CUDA's default          = {r['ovl'] / r['floor_cuda']:.2f}")
print(f"ratio default / sequential                         = {r['ovl'] / r['seq']:.2f}  (target <= 0.7)")
print(f"ratio default / original order and CUDA's default  = {r['ovl'] / r['seq_cuda']:.2f}")
print(f"copy back {r['copy']:.2f} ms (target < 8), comparison {r['compare']:.2f} ms (target < 7)")
print("scaling on one GPU (median of 3 runs):")
base = None
for ppd in (1, 2, 4, 8, 16):
    walls, rr, opened, ctx = [], [], [], []
    for _ in range(3):
        w, doc = run("--procs-per-device", str(ppd))
        walls.append(w)
        rr.append(max(phases(c)["round_robin"] for c in doc["children"]))
        opened.append(max(phases(c)["open_handles"] for c in doc["children"]))
        ctx.append(sum(phases(c)["context"] for c in doc["children"]))
    base = base or med(walls)
    print(f"  procs-per-device {ppd:>2}: wall {med(walls):7.1f} ms ({med(walls) / base:4.2f}x)"
          f"  children's contexts, summed {med(ctx):7.1f} ms"
          f"  slowest round-robin {med(rr):6.1f} ms  slowest handle opening {med(opened):5.1f} ms")

def timed(command, env):
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=dict(os.environ, **env))
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    return (time.perf_counter() - start) * 1e3


if probe:
    print("against the floor: ipc-floor N and simple-ipc --procs-per-device N, one GPU, one connection each")
    one = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    for n in (1, 2, 4, 8, 16):
        floor, ours = [], []
        for _ in range(runs):
            floor.append(timed([probe, str(n)], one))
            ours.append(timed([binary, "--procs-per-device", str(n)], one))
        print(f"  N = {n:>2}: floor {med(floor):7.1f} ms, simple-ipc {med(ours):7.1f} ms, "
              f"ratio {med(ours) / med(floor):.2f}x")

for extra in (["--topology"], ["--bench"]):
    print(f"== {os.path.basename(binary)} {' '.join(extra)}", flush=True)
    out = subprocess.run([binary, *extra], capture_output=True, text=True, timeout=600)
    print(out.stdout + out.stderr, end="")
    if out.returncode != 0:
        sys.exit(f"{' '.join(extra)} exited {out.returncode}")
