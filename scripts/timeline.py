#!/usr/bin/env python3
"""Where a run's time goes, on a CUDA host, from one run of this script:

    scripts/timeline.py SIMPLE_IPC [--runs N] [--floor IPC_FLOOR] [--only SECTION,...]

Sections (all by default; --only picks): counts, mechanisms, served, torch. Each prints medians of --runs
runs (5) in ms, from the runs' --json documents (docs/json.md, `run`):
  counts      the whole run and each phase of the parent and of the slowest child, for 1, 2, 4, 8 and 16
              processes on one GPU, beside the floor's whole run (IPC_FLOOR, scripts/floor/ipc-floor.cu)
  mechanisms  the same for legacy, vmm and pool at 2 processes (pool's time against legacy's)
  served      a served run (--serve, two joiners started with it, --ipc vmm --sync memops) against the
              same plain run
  torch       scripts/torch_ipc.py (the same work as PyTorch users write it) against simple-ipc, 1 and 4
              processes (needs python3 with torch)
Timings are whole wall times as this script sees them (start to exit), so they include exec and exit.
"""
import atexit, json, os, shutil, statistics, subprocess, sys, tempfile, time

args = sys.argv[1:]
if not args or args[0] in ("-h", "--help"):
    print(__doc__.strip())
    sys.exit(0 if args else 2)


def option(name, default=None, flag=False):
    if name not in args:
        return default
    i = args.index(name)
    if flag:
        del args[i]
        return True
    value = args[i + 1]
    del args[i:i + 2]
    return value


runs = int(option("--runs", 5))
floor = option("--floor")
only = set((option("--only") or "counts,mechanisms,served,torch").split(","))
if not args or not os.access(args[0], os.X_OK):
    sys.exit("timeline.py: the first argument is the simple-ipc binary to time (see --help)")
binary = os.path.realpath(args[0])
here = os.path.dirname(os.path.realpath(__file__))
tmp = tempfile.mkdtemp()
atexit.register(shutil.rmtree, tmp, True)
med = statistics.median
ONE_GPU = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
PARENT = ["cuda_start", "context", "device_selection", "start_children", "allocate_export", "wait_children", "verify",
          "clean_up", "total"]
CHILD = ["attach", "cuda_start", "wait_plan", "context", "prepare", "wait_ready", "open_handles", "round_robin",
         "copy_back", "verify", "clean_up", "total"]


def timed(command, env=None):
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **ONE_GPU, **(env or {})))
    wall = (time.perf_counter() - start) * 1e3
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {out.returncode}:\n{out.stdout}{out.stderr}")
    return wall


def ours(*extra):
    path = os.path.join(tmp, "run.json")
    wall = timed([binary, "--json", path, *extra])
    with open(path) as f:
        return wall, json.load(f)["run"]


def phases_of(docs):
    """Medians over runs: the parent's phases, and per phase the slowest child's."""
    parent = {p: med(d["parent"]["phases"].get(p, 0) for d in docs) for p in PARENT}
    child = {p: med(max(c["phases"].get(p, 0) for c in d["children"]) for d in docs) for p in CHILD}
    return parent, child


def show(label, walls, docs):
    parent, child = phases_of(docs)
    print(f"  {label}: whole {med(walls):7.1f}")
    print("    parent   " + "  ".join(f"{p} {parent[p]:.1f}" for p in PARENT if parent[p]))
    print("    slowest  " + "  ".join(f"{p} {child[p]:.1f}" for p in CHILD if child[p]))


def measure(*extra):
    walls, docs = [], []
    for _ in range(runs):
        w, d = ours(*extra)
        walls.append(w)
        docs.append(d)
    return walls, docs


if "counts" in only:
    print(f"== each phase, one GPU, medians of {runs} runs, ms (slowest: the slowest child's, per phase)")
    for n in (1, 2, 4, 8, 16):
        floor_walls = [timed([floor, str(n)]) for _ in range(runs)] if floor else []
        walls, docs = measure("--procs-per-device", str(n))
        said = f", the floor {med(floor_walls):.1f} ({med(walls) / med(floor_walls):.2f}x)" if floor else ""
        show(f"N = {n}{said}", walls, docs)

if "mechanisms" in only:
    print(f"== the mechanisms at 2 processes, medians of {runs} runs, ms")
    base = None
    for mechanism in ("legacy", "vmm", "pool"):
        walls, docs = measure("--procs-per-device", "2", "--ipc", mechanism)
        base = base or med(walls)
        show(f"{mechanism} ({med(walls) / base:.2f}x legacy)", walls, docs)

if "served" in only:
    print(f"== a served run and two joiners against the plain run (--ipc vmm --sync memops), {runs} runs, ms")
    common = ["--procs-per-device", "2", "--ipc", "vmm", "--sync", "memops"]
    plain_walls, plain_docs = measure(*common)
    served_walls, served_docs = [], []
    for i in range(runs):
        address = f"@timeline-{os.getpid()}-{i}"
        path = os.path.join(tmp, "served.json")
        env = dict(os.environ, **ONE_GPU)
        start = time.perf_counter()
        server = subprocess.Popen([binary, "--serve", address, "--json", path, *common], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        joiners = [subprocess.Popen([binary, "--join", address], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=120)[0] for p in [server, *joiners]]
        served_walls.append((time.perf_counter() - start) * 1e3)
        if any(p.returncode for p in [server, *joiners]):
            sys.exit("the served run failed:\n" + "\n".join(outs))
        with open(path) as f:
            served_docs.append(json.load(f)["run"])
    show("plain", plain_walls, plain_docs)
    show(f"served ({med(served_walls) / med(plain_walls):.2f}x plain)", served_walls, served_docs)

if "torch" in only:
    check = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        print("== PyTorch: not importable here, left out")
    else:
        print(f"== PyTorch {check.stdout.strip()} (scripts/torch_ipc.py) against simple-ipc, {runs} runs, ms")
        for n in (1, 4):
            theirs = [timed([sys.executable, os.path.join(here, "torch_ipc.py"), str(n)]) for _ in range(runs)]
            mine = [timed([binary, "--procs-per-device", str(n)]) for _ in range(runs)]
            print(f"  N = {n}: PyTorch {med(theirs):7.1f}, simple-ipc {med(mine):7.1f} "
                  f"(PyTorch takes {med(theirs) / med(mine):.1f}x)")
