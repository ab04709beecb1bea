#!/usr/bin/env python3
"""simpleIPC's work done the way a PyTorch user would write it, for a comparison of whole runs:

    scripts/torch_ipc.py N        (N processes on GPU 0; exit 0 once every buffer is verified)

The parent makes one 64 MiB buffer and one interprocess event per process on GPU 0 and starts N processes
with torch.multiprocessing ("spawn", as CUDA needs), which receive them as CUDA IPC handles (PyTorch's
reductions: cudaIpcGetMemHandle / cudaIpcGetEventHandle underneath). Each process writes the others'
buffers round-robin, as simpleKernel does (a fill with its index), ordered by the buffer's event and kept in
step by a barrier, then checks its own buffer holds (index + 1) % N. scripts/timeline.py times it against
simple-ipc with the same N.
"""
import sys

import torch
import torch.multiprocessing as mp

SIZE = 64 << 20


def child(index, n, buffers, events, barrier, done):
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for step in range(n):
            target = (step + index) % n
            stream.wait_event(events[target])
            buffers[target].fill_(index)
            events[target].record(stream)
            barrier.wait()
        stream.wait_event(events[index])
        ok = bool(torch.all(buffers[index] == (index + 1) % n).item())
    done.put((index, ok))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    ctx = mp.get_context("spawn")
    torch.cuda.set_device(0)
    buffers = [torch.zeros(SIZE, dtype=torch.uint8, device="cuda") for _ in range(n)]
    events = [torch.cuda.Event(interprocess=True, enable_timing=False) for _ in range(n)]
    for event in events:
        event.record()
    torch.cuda.synchronize()
    barrier, done = ctx.Barrier(n), ctx.Queue()
    processes = [ctx.Process(target=child, args=(i, n, buffers, events, barrier, done)) for i in range(n)]
    for p in processes:
        p.start()
    results = dict(done.get(timeout=120) for _ in range(n))
    for p in processes:
        p.join()
    bad = [i for i in range(n) if not results.get(i) or processes[i].exitcode != 0]
    if bad:
        sys.exit(f"torch_ipc: processes {bad} failed")
    print(f"torch_ipc: {n} processes passed")


if __name__ == "__main__":
    main()
