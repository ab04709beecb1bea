#!/usr/bin/env bash
# What an MPS client gets across each namespace boundary from its daemon (issue 24): a daemon of this script's
# own (private pipe and log directories under /tmp, quit at the end), then one run of simple-ipc per boundary,
# made with unshare or with --isolate. For each: the exit status, whether the verdict said "under MPS", and
# whether the daemon's own log counted a new client (the daemon's word, not ours), one line each:
#   BOUNDARY | exit N | said: under MPS / nothing | daemon: N new clients | last line
#   scripts/mps-boundaries.sh [BINARY]     (root; needs nvidia-cuda-mps-control and unshare)
set -u
bin=$(realpath "${1:-target/release/simple-ipc}")
[ -x "$bin" ] || { echo "no executable at $bin"; exit 1; }
command -v nvidia-cuda-mps-control >/dev/null || { echo "no nvidia-cuda-mps-control here"; exit 2; }
mps=$(mktemp -d /tmp/simple-ipc-mps-XXXXXX)
mkdir -p "$mps/pipe" "$mps/log"
export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
quit() { echo quit | nvidia-cuda-mps-control; for _ in $(seq 100); do [ -S "$mps/pipe/control" ] || break; sleep 0.05; done; rm -rf "$mps"; }
trap quit EXIT
nvidia-cuda-mps-control -d || { echo "nvidia-cuda-mps-control -d failed"; exit 1; }
for _ in $(seq 100); do [ -S "$mps/pipe/control" ] && break; sleep 0.05; done
clients() { cat "$mps/log/control.log" 2>/dev/null | grep -c "NEW CLIENT" || true; } # the control daemon's word
out=$(mktemp)
one() { # one NAME COMMAND...: runs it, prints its line
  local name=$1; shift
  local before rc said
  before=$(clients)
  timeout 60 "$@" >"$out" 2>&1; rc=$?
  sleep 0.2
  if tail -n 1 "$out" | grep -q "under MPS"; then said="under MPS"; else said="nothing"; fi
  printf '%-44s | exit %3d | said: %-9s | daemon: %s new clients | %s\n' "$name" "$rc" "$said" \
    "$(( $(clients) - before ))" "$(tail -n 1 "$out" | cut -c1-150)"
}
echo "== MPS across namespace boundaries: $bin (pipe directory $mps/pipe)"
one "same namespaces" "$bin" --procs-per-device 2
one "same namespaces, vmm" "$bin" --ipc vmm --procs-per-device 2
one "own PID namespace (unshare -pf --mount-proc)" unshare --pid --fork --mount-proc "$bin" --procs-per-device 2
one "own IPC namespace (unshare -i)" unshare --ipc "$bin" --procs-per-device 2
one "own mount ns, pipe directory hidden" unshare --mount sh -c "mount -t tmpfs none '$mps/pipe' && exec '$bin' --procs-per-device 2"
one "own /dev/shm (unshare -m, tmpfs on /dev/shm)" unshare --mount sh -c "mount -t tmpfs none /dev/shm && exec '$bin' --procs-per-device 2"
one "own user namespace (unshare -r)" unshare --user --map-root-user "$bin" --procs-per-device 2
one "--isolate pid (joiners: own PID ns)" "$bin" --isolate pid --procs-per-device 2
one "--isolate shm" "$bin" --isolate shm --procs-per-device 2
one "--isolate ipc" "$bin" --isolate ipc --procs-per-device 2
one "--isolate container" "$bin" --isolate container --procs-per-device 2
one "--isolate container, vmm" "$bin" --isolate container --ipc vmm --procs-per-device 2
# A daemon in a PID namespace of its own (its pid 1, in the foreground), the clients in this one.
echo quit | nvidia-cuda-mps-control; for _ in $(seq 100); do [ -S "$mps/pipe/control" ] || break; sleep 0.05; done
unshare --pid --fork --mount-proc nvidia-cuda-mps-control -f >/dev/null 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$mps/pipe/control" ] && break; sleep 0.05; done
one "daemon in its own PID namespace" "$bin" --procs-per-device 2
echo quit | nvidia-cuda-mps-control; wait "$daemon" 2>/dev/null
nvidia-cuda-mps-control -d || { echo "nvidia-cuda-mps-control -d failed"; exit 1; }
for _ in $(seq 100); do [ -S "$mps/pipe/control" ] && break; sleep 0.05; done
# A `control` socket that is no daemon (it accepts and closes at once): does the client trust it?
fake=$(mktemp -d /tmp/simple-ipc-fake-mps-XXXXXX)
python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1] + '/control'); s.listen(64)
while True:
    c, _ = s.accept(); c.close()
" "$fake" &
impostor=$!
for _ in $(seq 100); do [ -S "$fake/control" ] && break; sleep 0.05; done
CUDA_MPS_PIPE_DIRECTORY="$fake" one "a control socket that is no daemon" env CUDA_MPS_PIPE_DIRECTORY="$fake" "$bin" --procs-per-device 2
kill "$impostor"; wait "$impostor" 2>/dev/null; rm -rf "$fake"
start=$(date +%s.%N)
one "matrix: --ipc all --isolate container,user" "$bin" --ipc all --isolate container,user
echo "matrix took $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s under MPS; its table:"
grep -v "^$" "$out" | tail -n 30
echo "== the daemon's log (last lines)"
tail -n 15 "$mps/log/control.log" 2>/dev/null
tail -n 15 "$mps/log/server.log" 2>/dev/null
rm -f "$out"
