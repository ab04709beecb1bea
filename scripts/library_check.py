#!/usr/bin/env python3
"""The forecast against the libraries themselves (scripts/library-check.sh runs it on a CUDA host, as root).

For each cell of the namespace matrix, made with unshare(1) as containers make them, it runs
- a served run of simple-ipc, its server where the exporter stands and its joiner where the importer does,
  whose --json document holds the forecast of each library path for that pair (before the run) and the
  same computed from what the run measured;
- PyTorch's own sharing of a CUDA tensor (torch.multiprocessing's reduce_tensor, as a DataLoader or
  torch.multiprocessing.Queue sends it) from a producer where the exporter stands to a consumer where the
  importer does, with the default allocator and with expandable_segments:True;
- simple-ipc --between PRODUCER CONSUMER, asked with the PyTorch processes' own pids while they run (each
  has imported torch and holds its settings), so that the forecast is read from outside, from the real
  processes, their settings and the libraries they have loaded;
and prints each forecast beside PyTorch's outcome. Exit status 1 on any disagreement (a forecast of "works"
where PyTorch failed, or "fails" where it worked; "not known" is reported, never counted as agreement).
Where the importer cannot join a served run (another uid), the served forecast is "none", and --between
alone answers.

With two GPUs (LIBRARY_CHECK_NCCL=1, set by library-check.sh where nvidia-smi lists two), the NCCL part:
two ranks of torch.distributed with the NCCL backend, one a GPU, in the cells that matter to NCCL
(one network namespace or not, one /dev/shm or not, NCCL_CUMEM_ENABLE=0 and 1), their transport read from
NCCL_DEBUG=INFO, beside the forecast of NCCL P2P and NCCL SHM.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else "target/release/simple-ipc")
WORK = tempfile.mkdtemp(prefix="library-check-", dir="/tmp")
os.chmod(WORK, 0o755)
LIMIT = 90

# How each side stands: the unshare(1) options, and whether it gets a /dev/shm of its own (a tmpfs mounted
# in a mount namespace of its own) and a hostname of its own (a UTS namespace).
SAME = {"unshare": [], "own_shm": False, "hostname": None}
# Beyond unshare: "setpriv" (another uid), "env" (the side's own settings), "beside_init" (the process is
# not its PID namespace's init but pid 2 beside a shell that is), "seccomp" (a filter refusing pidfd_getfd).
NOBODY = {"unshare": [], "own_shm": False, "hostname": None,
          "setpriv": ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]}
UNMAPPED = {"unshare": ["--user"], "own_shm": False, "hostname": None}
PID_BESIDE_INIT = {"unshare": ["--pid", "--fork", "--mount-proc"], "own_shm": False, "hostname": None,
                   "beside_init": True}
NO_GPU = {"unshare": [], "own_shm": False, "hostname": None, "env": {"CUDA_VISIBLE_DEVICES": ""}}
SECCOMP = {"unshare": [], "own_shm": False, "hostname": None, "seccomp": True}
PID = {"unshare": ["--pid", "--fork", "--mount-proc"], "own_shm": False, "hostname": None}
SHM = {"unshare": ["--mount"], "own_shm": True, "hostname": None}
USER = {"unshare": ["--user", "--map-root-user"], "own_shm": False, "hostname": None}
NET = {"unshare": ["--net"], "own_shm": False, "hostname": None}
# Docker's default for a container: its own PID, mount (with its own /dev/shm), network, UTS and IPC
# namespaces; the user namespace of the host.
DOCKER = {
    "unshare": ["--pid", "--fork", "--mount-proc", "--net", "--uts", "--ipc"],
    "own_shm": True,
    "hostname": "container",
}

CELLS = [
    ("same namespaces", SAME, SAME),
    ("importer in a PID namespace of its own (other pid numbers)", SAME, PID),
    ("both in PID namespaces of their own (both pid 1)", PID, PID),
    ("importer with a /dev/shm of its own", SAME, SHM),
    ("importer in a user namespace of its own (root mapped)", SAME, USER),
    ("importer in a network namespace of its own", SAME, NET),
    ("importer in Docker's default namespaces", SAME, DOCKER),
    ("both in Docker's default namespaces", DOCKER, DOCKER),
    ("importer of another uid (65534)", SAME, NOBODY),
    ("importer in a user namespace without a map", SAME, UNMAPPED),
    ("importer pid 2 beside its own pid 1, exporter pid 1", PID, PID_BESIDE_INIT),
    ("importer that sees no GPU (CUDA_VISIBLE_DEVICES=)", SAME, NO_GPU),
    ("importer under a seccomp filter refusing pidfd_getfd", SAME, SECCOMP),
]

# Installs a seccomp filter that answers pidfd_getfd (438 on x86_64) with EPERM, then execs the rest.
SECCOMP_EXEC = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def insn(code, jt, jf, k): return struct.pack("HBBI", code, jt, jf, k)
prog = b"".join([insn(0x20, 0, 0, 0), insn(0x15, 0, 1, 438), insn(0x06, 0, 0, 0x00050000 | 1),
                 insn(0x06, 0, 0, 0x7fff0000)])
buf = ctypes.create_string_buffer(prog)
class Fprog(ctypes.Structure): _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
assert libc.prctl(38, 1, 0, 0, 0) == 0                      # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0    # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
os.execvp(sys.argv[1], sys.argv[1:])
"""

PRODUCER = r"""
import os, pickle, sys, time, torch
from torch.multiprocessing.reductions import reduce_tensor
handoff, done = sys.argv[1], sys.argv[2]
t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
torch.cuda.synchronize()
rebuild, args = reduce_tensor(t)
with open(handoff + ".tmp", "wb") as f:
    pickle.dump((rebuild, args), f)
os.rename(handoff + ".tmp", handoff)
deadline = time.time() + 60
while not os.path.exists(done) and time.time() < deadline:
    time.sleep(0.05)
print("producer pid", os.getpid(), "expandable", torch.cuda.memory.get_allocator_backend())
"""

CONSUMER = r"""
import os, pickle, sys, time, torch
handoff, done, result = sys.argv[1], sys.argv[2], sys.argv[3]
ready, go = handoff + ".consumer-ready", handoff + ".go"
open(ready, "w").close()
deadline = time.time() + 60
while not (os.path.exists(handoff) and os.path.exists(go)) and time.time() < deadline:
    time.sleep(0.05)
try:
    with open(handoff, "rb") as f:
        rebuild, args = pickle.load(f)
    t = rebuild(*args)
    total = t.double().sum().item()
    expected = float((1 << 20) * ((1 << 20) - 1) // 2)
    outcome = "works" if total == expected else "fails: wrong contents (%r, not %r)" % (total, expected)
except BaseException as e:
    outcome = "fails: " + " ".join(str(e).split())[:300]
with open(result, "w") as f:
    f.write(outcome)
open(done, "w").close()
"""


def wrap(side, argv, role):
    """argv run where `side` stands, as `role` (exporter or importer): under unshare(1), with its own /dev/shm
    and hostname where it has them (each container its own, as Docker names them)."""
    setup = []
    if side.get("seccomp"):
        argv = [sys.executable, "-c", SECCOMP_EXEC, *argv]
    if side["own_shm"]:
        setup.append("mount -t tmpfs -o mode=1777,size=1g tmpfs /dev/shm")
    if side["hostname"]:
        setup.append("hostname %s-%s" % (side["hostname"], role))
    prefix = side.get("setpriv", [])
    if not side["unshare"] and not setup and not side.get("beside_init"):
        return prefix + argv
    run = '"$@" & wait $!' if side.get("beside_init") else 'exec "$@"'
    script = " && ".join(setup + [run])
    return prefix + ["unshare", *side["unshare"], "sh", "-c", script, "sh", *argv]


def start(side, argv, env, log, role):
    env = dict(env, **side.get("env", {}))
    return subprocess.Popen(wrap(side, argv, role), env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def python_of(session):
    """The pid (as this process sees it) of the Python process of the session that `session` leads: the
    PyTorch process itself, under whatever unshare, sh or setpriv started it."""
    for _ in range(600):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = open("/proc/%s/stat" % entry).read()
                sid = int(stat.rsplit(") ", 1)[1].split()[3])
                exe = os.readlink("/proc/%s/exe" % entry)
                cmdline = open("/proc/%s/cmdline" % entry, "rb").read()
            except (OSError, ValueError, IndexError):
                continue
            if sid == session and "python" in os.path.basename(exe) and b"import os, pickle" in cmdline:
                return int(entry)
        time.sleep(0.05)
    return None


def between(producer, consumer):
    """simple-ipc --between with the PyTorch processes' own pids: its library rows for the producer's
    exports to the consumer, or None and why."""
    r = subprocess.run([BIN, "--between", str(producer), str(consumer), "--json", "-"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return None, "--between: exit %d: %s" % (r.returncode, r.stderr.strip()[-300:])
    answer = json.loads(r.stdout)
    rows = {row["path"]: row for row in answer["directions"][0]["processes"][0]["libraries"]}
    loaded = answer["processes"][1]["loaded"]
    return rows, loaded


def finish(processes):
    deadline = time.time() + LIMIT
    for p in processes:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()


def env_with(extra):
    env = dict(os.environ)
    env.pop("SIMPLE_IPC_SIMULATE_GPUS", None)
    env.update(extra)
    return env


def forecast(cell, exporter, importer, extra):
    """The served run's document: the forecast of each library path, and the same from what it measured."""
    d = os.path.join(WORK, "serve-%d" % cell)
    os.makedirs(d)
    os.chmod(d, 0o777)
    sock, doc = os.path.join(d, "run.sock"), os.path.join(d, "run.json")
    env = env_with(extra)
    with open(os.path.join(d, "log"), "w") as log:
        server = start(exporter, [BIN, "--serve", sock, "--json", doc, "--timeout", "60"], env, log, "exporter")
        deadline = time.time() + 30
        while not os.path.exists(sock) and time.time() < deadline and server.poll() is None:
            time.sleep(0.05)
        joiner = start(importer, [BIN, "--join", sock, "--timeout", "60"], env, log, "importer")
        finish([server, joiner])
    try:
        with open(doc) as f:
            document = json.load(f)
    except (OSError, ValueError) as e:
        return None, None, "no document (%s); the run said: %s" % (e, open(os.path.join(d, "log")).read()[-800:])
    processes = (document.get("placement") or {}).get("processes") or []
    if not processes:
        return None, None, "no placement in the document: %s" % document.get("reason")
    rows = {r["path"]: r for r in processes[0]["libraries"]}
    measured = {r["path"]: r for r in processes[0].get("libraries_measured") or []}
    return rows, measured, document.get("status")


def pytorch(cell, exporter, importer, extra):
    d = os.path.join(WORK, "torch-%d-%s" % (cell, "e" if extra else "d"))
    os.makedirs(d)
    os.chmod(d, 0o777)
    handoff, done, result = (os.path.join(d, n) for n in ("handoff", "done", "result"))
    env = env_with(extra)
    asked = (None, "--between: not asked")
    with open(os.path.join(d, "log"), "w") as log:
        producer = start(exporter, [sys.executable, "-c", PRODUCER, handoff, done], env, log, "exporter")
        consumer = start(importer, [sys.executable, "-c", CONSUMER, handoff, done, result], env, log, "importer")
        deadline = time.time() + 60
        while time.time() < deadline and not (os.path.exists(handoff) and os.path.exists(handoff + ".consumer-ready")):
            if producer.poll() is not None or consumer.poll() is not None:
                break
            time.sleep(0.05)
        # Both run, the producer has shared its tensor, the consumer has imported torch: ask from outside.
        producer_pid, consumer_pid = python_of(producer.pid), python_of(consumer.pid)
        if producer_pid and consumer_pid:
            asked = between(producer_pid, consumer_pid)
        else:
            asked = (None, "--between: the PyTorch processes were not found (%s, %s)" % (producer_pid, consumer_pid))
        open(handoff + ".go", "w").close()
        finish([consumer, producer])
    try:
        outcome = open(result).read().strip()
    except OSError:
        outcome = "fails: no result (%s)" % open(os.path.join(d, "log")).read()[-300:].replace("\n", " ")
    return outcome, asked


def agrees(verdict, outcome):
    said = verdict["verdict"]
    if said == "not_known":
        return None
    return (said == "works") == (outcome == "works")


def word(row):
    if row is None:
        return "no forecast"
    detail = row.get("detail")
    return row["verdict"] + (" (%s)" % detail if detail else "")


def check_cell(i, name, exporter, importer):
    """One cell: each PyTorch path, asked of a served run and of --between. Its lines, and its counts."""
    lines, disagreements, unknown, checked = ["-- %s" % name], 0, 0, 0
    expandable = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    for path, extra in (("PyTorch CUDA IPC", {}), ("PyTorch expandable_segments", expandable)):
        served_joins = "setpriv" not in importer and "setpriv" not in exporter
        rows, measured, status = (forecast(i * 2 + (1 if extra else 0), exporter, importer, extra)
                                  if served_joins else (None, None, "not run"))
        outcome, (outside, loaded) = pytorch(i, exporter, importer, extra)
        asks = [("served", rows, "after the served run (%s): %s" % (status, word((measured or {}).get(path))))]
        if not served_joins:
            asks = []  # another uid may not join a served run: --between alone answers
            lines.append("  (served: another uid may not join it; --between alone answers)")
        said = loaded if outside is None else ", ".join(
            "%s %s" % (k, (v or {}).get("version") or ("of a version not read" if v else "not loaded"))
            for k, v in loaded.items())
        asks.append(("--between", outside, "the consumer's libraries: %s" % said))
        for how, forecast_rows, said in asks:
            if forecast_rows is None:
                lines.append("  FAIL %s (%s): no forecast: %s; PyTorch: %s"
                             % (path, how, status if how == "served" else said, outcome))
                disagreements += 1
                continue
            row = forecast_rows.get(path)
            a = agrees(row, outcome) if row else False
            checked += 1
            mark = {True: "agree", False: "DISAGREE", None: "not known"}[a]
            disagreements += a is False
            unknown += a is None
            lines.append("  %-9s %s, %s: forecast %s; %s; PyTorch: %s" % (mark, path, how, word(row), said, outcome))
    return lines, disagreements, unknown, checked


def main():
    import torch  # noqa: F401  (fails early where PyTorch is missing)
    from concurrent.futures import ThreadPoolExecutor
    print("== library check: %s, PyTorch %s, %s" % (BIN, torch.__version__, torch.cuda.get_device_name(0)))
    disagreements, unknown, checked = 0, 0, 0
    # Cells whose exporter is pid 1 of a PID namespace of its own name their events' files in the host's
    # /dev/shm by that pid: two at once would collide, so those run one after another, the rest at once.
    alone = [i for i, (_, exporter, _) in enumerate(CELLS) if "--pid" in exporter["unshare"]]
    together = [i for i in range(len(CELLS)) if i not in alone]
    results = {}
    with ThreadPoolExecutor(max_workers=int(os.environ.get("LIBRARY_CHECK_PARALLEL", "6"))) as pool:
        for i, result in zip(together, pool.map(lambda i: check_cell(i, *CELLS[i]), together)):
            results[i] = result
    for i in alone:
        results[i] = check_cell(i, *CELLS[i])
    for i in range(len(CELLS)):
        lines, d, u, c = results[i]
        print("\n".join(lines))
        disagreements, unknown, checked = disagreements + d, unknown + u, checked + c
    if os.environ.get("LIBRARY_CHECK_NCCL") == "1":
        d, u, c = nccl()
        disagreements, unknown, checked = disagreements + d, unknown + u, checked + c
    else:
        print("-- NCCL: not run (two ranks need two GPUs; LIBRARY_CHECK_NCCL=1 where there are two)")
    print("== library check: %d checked, %d agree, %d disagree, %d not known"
          % (checked, checked - disagreements - unknown, disagreements, unknown))
    shutil.rmtree(WORK, ignore_errors=True)
    return 1 if disagreements else 0


NCCL_RANK = r"""
import os, sys, torch, torch.distributed as dist
rank, store, result = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.cuda.set_device(rank)
try:
    dist.init_process_group("nccl", init_method="file://" + store, rank=rank, world_size=2)
    t = torch.ones(1 << 20, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    outcome = "works" if t[0].item() == 3.0 else "fails: wrong sum"
    dist.destroy_process_group()
except BaseException as e:
    outcome = "fails: " + " ".join(str(e).split())[:300]
open(result, "w").write(outcome)
"""


def nccl():
    """Two ranks, one a GPU, in each cell that matters to NCCL; the transport NCCL chose, from its log."""
    cells = [
        ("same namespaces", SAME, SAME, {}),
        ("another network namespace (cuMem)", SAME, NET, {}),
        ("another network namespace, NCCL_CUMEM_ENABLE=0", SAME, NET, {"NCCL_CUMEM_ENABLE": "0"}),
        ("another /dev/shm", SAME, SHM, {}),
        ("Docker's default on both, NCCL_HOSTID shared", DOCKER, DOCKER, {"NCCL_HOSTID": "one"}),
    ]
    disagreements, unknown, checked = 0, 0, 0
    print("-- NCCL")
    for i, (name, exporter, importer, extra) in enumerate(cells):
        rows, _, status = forecast(100 + i, exporter, importer, extra)
        d = os.path.join(WORK, "nccl-%d" % i)
        os.makedirs(d)
        os.chmod(d, 0o777)
        env = env_with(dict(extra, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P,SHM,NET"))
        logs = [open(os.path.join(d, "log%d" % r), "w") for r in (0, 1)]
        ranks = [start(side, [sys.executable, "-c", NCCL_RANK, str(r), os.path.join(d, "store"),
                              os.path.join(d, "result%d" % r)], env, logs[r], role)
                 for r, side, role in ((0, exporter, "exporter"), (1, importer, "importer"))]
        finish(ranks)
        for log in logs:
            log.close()
        text = open(os.path.join(d, "log0")).read() + open(os.path.join(d, "log1")).read()
        transport = ("P2P" if "via P2P" in text else "SHM" if "via SHM" in text
                     else "NET" if "via NET" in text else "none")
        outcomes = [open(os.path.join(d, "result%d" % r)).read().strip() if os.path.exists(
            os.path.join(d, "result%d" % r)) else "fails: no result" for r in (0, 1)]
        ok = all(o == "works" for o in outcomes)
        if rows is None:
            print("  FAIL %s: no forecast (%s)" % (name, status))
            disagreements += 1
            continue
        p2p, shm = rows.get("NCCL P2P"), rows.get("NCCL SHM")
        if p2p["verdict"] == "works":
            expected = "P2P"
        elif p2p["verdict"] == "falls_back" and shm["verdict"] == "works":
            expected = "SHM"
        elif p2p["verdict"] == "falls_back" and shm["verdict"] == "falls_back":
            expected = "NET"
        elif p2p["verdict"] == "fails":
            expected = "an error"
        else:
            expected = None
        seen = transport if ok else "an error"
        a = None if expected is None else (expected == seen)
        checked += 1
        disagreements += a is False
        unknown += a is None
        print("  %-9s %s: forecast P2P %s, SHM %s; NCCL: %s (%s)" % (
            {True: "agree", False: "DISAGREE", None: "not known"}[a], name, word(p2p), word(shm), seen,
            "; ".join(outcomes)))
    return disagreements, unknown, checked


if __name__ == "__main__":
    sys.exit(main())
