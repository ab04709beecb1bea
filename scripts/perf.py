#!/usr/bin/env python3
"""Start-up, verification and scaling of simple-ipc on a GPU host, measured in one run.

    scripts/perf.py [BINARY] [--runs N]     (default: target/release/simple-ipc, 5 runs)

Prints medians over N runs of: the CUDA start-up of one process (the floor: the parent's cuInit plus primary
context in the --sequential runs, where nothing else competes), the whole run in the default (overlapped) and
the original's sequential order, the copy back and the comparison of 64 MiB, and the wall time for
--procs-per-device 1, 2, 4, 8, 16; then the ratios that issue 4 sets targets for.
"""
import json, os, statistics, subprocess, sys, tempfile, time

args = [a for a in sys.argv[1:]]
runs = 5
if "--runs" in args:
    i = args.index("--runs"); runs = int(args[i + 1]); del args[i:i + 2]
binary = os.path.realpath(args[0] if args else "target/release/simple-ipc")
tmp = tempfile.mkdtemp()


def run(*extra):
    path = os.path.join(tmp, "t.json")
    start = time.perf_counter()
    out = subprocess.run([binary, "--json", path, *extra], capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{binary} {' '.join(extra)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    with open(path) as f:
        return wall * 1e3, json.load(f)


med = statistics.median
floor, seq_wall, ovl_wall, copy, compare, child_ctx = [], [], [], [], [], []
for _ in range(runs):
    w, doc = run("--sequential")
    seq_wall.append(w)
    floor.append(doc["parent"]["cuda_start"] + doc["parent"]["context"])
    w, doc = run()
    ovl_wall.append(w)
    c = doc["children"][0]
    copy.append(c["copy_back"]); compare.append(c["compare"]); child_ctx.append(c["context"])
    assert doc["buffer_bytes"] == 64 << 20, doc

print(f"== simple-ipc performance: {binary}, medians of {runs} runs, ms")
print(f"{'CUDA start-up of one process (floor)':<44}{med(floor):>9.1f}")
print(f"{'whole run, sequential (original order)':<44}{med(seq_wall):>9.1f}")
print(f"{'whole run, overlapped (default)':<44}{med(ovl_wall):>9.1f}")
print(f"{'  child context creation while overlapped':<44}{med(child_ctx):>9.1f}")
print(f"{'copy back of 64 MiB (pinned, pre-faulted)':<44}{med(copy):>9.2f}")
print(f"{'comparison of 64 MiB':<44}{med(compare):>9.2f}")
print(f"ratio overlapped / floor       = {med(ovl_wall) / med(floor):.2f}   (target <= 1.5)")
print(f"ratio overlapped / sequential  = {med(ovl_wall) / med(seq_wall):.2f}   (target <= 0.7)")
print(f"copy back {med(copy):.2f} ms (target < 8), comparison {med(compare):.2f} ms (target < 7)")
print("scaling on one GPU (median of 3 runs):")
base = None
for ppd in (1, 2, 4, 8, 16):
    walls, rr, opened = [], [], []
    for _ in range(3):
        w, doc = run("--procs-per-device", str(ppd))
        walls.append(w)
        rr.append(max(c["round_robin"] for c in doc["children"]))
        opened.append(max(c["open_handles"] for c in doc["children"]))
    base = base or med(walls)
    print(f"  procs-per-device {ppd:>2}: wall {med(walls):8.1f} ms  ({med(walls) / base:4.2f}x)"
          f"  slowest round-robin {med(rr):7.1f} ms  slowest handle opening {med(opened):6.1f} ms")
