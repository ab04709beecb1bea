#!/usr/bin/env python3
"""Probe: how many of a process's interprocess events share one driver file in /dev/shm.

Run on a GPU host: python3 scripts/probes/events_per_file.py [EVENTS]
Makes EVENTS (default 4) interprocess events (cuEventCreate, CU_EVENT_INTERPROCESS, cuIpcGetEventHandle) one
after another and prints, after each, the driver's files (cuda.shm.*) this process maps, from /proc/self/maps.
"""
import ctypes, os, sys

def driver_files():
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "/cuda.shm." in line})

lib = ctypes.CDLL("libcuda.so.1")
assert lib.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert lib.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert lib.cuCtxSetCurrent(ctx) == 0
print(f"pid {os.getpid()}; before any event: {driver_files()}")
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    event, handle = ctypes.c_void_p(), ctypes.create_string_buffer(64)
    assert lib.cuEventCreate(ctypes.byref(event), 0x2 | 0x4) == 0  # DISABLE_TIMING | INTERPROCESS
    assert lib.cuIpcGetEventHandle(handle, event) == 0
    print(f"after event {i + 1}: {driver_files()}")
