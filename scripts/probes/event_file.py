#!/usr/bin/env python3
"""Probe: the file behind a CUDA interprocess event (owner, mode) and who can open it.

Run as root on a GPU host: python3 scripts/probes/event_file.py
The exporter makes an interprocess event (cuEventCreate, CU_EVENT_INTERPROCESS), shows the files it holds in
/dev/shm, then an importer in each placement (another uid by setpriv, a user namespace with and without a map,
unshare) opens the file itself and then the handle with cuIpcOpenEventHandle, and says what each answered.
"""
import ctypes, os, stat, subprocess, sys

class IpcEventHandle(ctypes.Structure):
    """CUipcEventHandle: 64 bytes, passed by value to cuIpcOpenEventHandle."""
    _fields_ = [("reserved", ctypes.c_char * 64)]

def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuIpcOpenEventHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), IpcEventHandle]
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), IpcEventHandle, ctypes.c_uint]
    return lib

def check(lib, what, rc):
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        return f"{what}: {name.value.decode() if name.value else rc}"
    return None

def context(lib):
    assert lib.cuInit(0) == 0
    dev = ctypes.c_int()
    assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0

def importer(handle_hex, path, memory_hex):
    out = []
    try:
        fd = os.open(path, os.O_RDWR)
        os.close(fd)
        out.append("open(O_RDWR): ok")
    except OSError as e:
        out.append(f"open(O_RDWR): {e.strerror}")
    out.append(f"uid {os.getuid()} euid {os.geteuid()} uid_map {open('/proc/self/uid_map').read().split()}")
    lib = cuda()
    rc = lib.cuInit(0)
    if rc:
        print("; ".join(out + [check(lib, "cuInit", rc)])); return
    context(lib)
    handle = IpcEventHandle.from_buffer_copy(bytes.fromhex(handle_hex))
    event = ctypes.c_void_p()
    rc = lib.cuIpcOpenEventHandle(ctypes.byref(event), handle)
    out.append(check(lib, "cuIpcOpenEventHandle", rc) or "cuIpcOpenEventHandle: ok")
    pointer = ctypes.c_uint64()
    memory = IpcEventHandle.from_buffer_copy(bytes.fromhex(memory_hex))
    rc = lib.cuIpcOpenMemHandle_v2(ctypes.byref(pointer), memory, 1)
    out.append(check(lib, "cuIpcOpenMemHandle", rc) or "cuIpcOpenMemHandle: ok")
    print("; ".join(out))

def exporter():
    lib = cuda()
    context(lib)
    event = ctypes.c_void_p()
    assert lib.cuEventCreate(ctypes.byref(event), 0x2 | 0x4) == 0
    handle = IpcEventHandle()
    assert lib.cuIpcGetEventHandle(ctypes.byref(handle), event) == 0
    buffer = ctypes.c_uint64()
    assert lib.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(1 << 21)) == 0
    memory = IpcEventHandle()
    assert lib.cuIpcGetMemHandle(ctypes.byref(memory), buffer) == 0
    pid = os.getpid()
    mine = [f for f in os.listdir("/dev/shm") if f.startswith(f"cuda.shm.0.{pid:x}.")]
    if not mine:
        print(f"  no /dev/shm/cuda.shm.0.{pid:x}.*; its maps: " + ", ".join(
            sorted({l.split()[-1] for l in open("/proc/self/maps") if "/dev/shm" in l or "cuda.shm" in l})))
    print(f"exporter pid {pid} uid {os.geteuid()} umask {oct(os.umask(0o022))}")
    for f in mine:
        st = os.stat("/dev/shm/" + f)
        print(f"  /dev/shm/{f}: owner {st.st_uid}:{st.st_gid} mode {stat.filemode(st.st_mode)} ({oct(st.st_mode & 0o7777)}) size {st.st_size}")
    path = "/dev/shm/" + mine[-1] if mine else "/dev/shm/none"
    me = [sys.executable, os.path.abspath(__file__), "--import", bytes(handle).hex(), path, bytes(memory).hex()]
    placements = {
        "root, same namespaces": [],
        "uid 65534 (setpriv)": ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"],
        "user namespace, no map (unshare --user)": ["unshare", "--user"],
        "user namespace, root mapped (unshare --user -r)": ["unshare", "--user", "--map-root-user"],
        "PID namespace (unshare --pid --fork --mount-proc)": ["unshare", "--pid", "--fork", "--mount-proc"],
    }
    for name, prefix in placements.items():
        r = subprocess.run(prefix + me, capture_output=True, text=True, timeout=60)
        print(f"  importer {name}: {r.stdout.strip()} {r.stderr.strip()[-300:]}")

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--import":
        importer(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) > 1 and sys.argv[1] == "--as-nobody":
        exporter()
    else:
        exporter()
