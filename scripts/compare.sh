#!/usr/bin/env bash
# Paired comparisons on a CUDA host, from one run: NVIDIA's simpleIPC against simple-ipc (each at its
# defaults), and the project's floor (scripts/floor/ipc-floor.cu: the least program doing the same IPC work,
# events, kernel and copy back included) against simple-ipc with the same number of processes, for N = 1
# (or the GPU count) up to 16; each IPC mechanism against legacy; and, where nvidia-cuda-mps-control is
# found, whole runs under an MPS daemon of its own against the same runs without.
#   scripts/compare.sh SIMPLE_IPC ORIGINAL [ROUNDS]     (ORIGINAL "-": no NVIDIA sample on this host; the
#                                                     floor and the mechanisms are compared still)
# A run's time depends on whether the driver is already initialised: a run that is the only CUDA process
# pays the driver's start on the GPUs ("cold"), one beside a process that holds a context does not ("warm",
# as on a node with persistence mode or with another CUDA process up). So the comparisons run twice, cold
# and then warm, where a context holder of this script's own (a few lines of CUDA built here, holding a
# context on every visible GPU) is up for the length of the warm sections and ended by its pid when they
# end. WARM=0 runs the cold sections only, WARM=1 the warm ones only, WARM=both (the default) both. The MPS
# section measures its "without" runs cold (before its daemon starts, no holder) and warm (the holder, no
# daemon), since a daemon keeps the driver initialised, and gives each ratio with its baseline.
# It prints the date, the driver and the GPUs first, so that pasted figures carry them.
# The container matrix, its rows at once against one cell after another, is timed beside this script, by
# scripts/compare-matrix.sh (it needs namespaces, and no NVIDIA sample).
# The floor and the holder are built here with nvcc (NVCC, or nvcc on PATH; FLOOR_ARCH, default
# -arch=native, picks the floor's GPU code). NVIDIA's sample is built by hand on that host (keep its code
# out of this repository):
#   nvcc -O2 -I<cuda-samples>/Common -o /tmp/simpleIPC <cuda-samples>/Samples/0_Introduction/simpleIPC/simpleIPC.cu \
#        <cuda-samples>/Common/helper_multiprocess.cpp
# The original leaves /dev/shm/simpleIPCshm<pid> and the driver's cuda.shm.* files behind at every run; this
# script removes exactly those.
set -u
if [ $# -lt 2 ]; then
  echo "usage: [WARM=0|1|both] scripts/compare.sh SIMPLE_IPC ORIGINAL [ROUNDS]" >&2
  exit 1
fi
case ${WARM:-both} in
  0) states=cold ;;
  1) states=warm ;;
  both) states="cold warm" ;;
  *) echo "compare.sh: WARM is 0 (cold only), 1 (warm only) or both, not '$WARM'" >&2; exit 1 ;;
esac
ours=$(realpath "$1"); original=$2; rounds=${3:-5}
[ "$original" = - ] || original=$(realpath "$original")
repo=$(cd "$(dirname "$0")/.." && pwd)

# The host, first (nvidia-smi lists all of the host's GPUs, whatever CUDA_VISIBLE_DEVICES says).
smi=$(nvidia-smi --query-gpu=driver_version,name,persistence_mode --format=csv,noheader 2>/dev/null)
driver=$(echo "$smi" | cut -s -d, -f1 | sed 's/^ *//' | sort -u | paste -sd/)
names=$(echo "$smi" | cut -s -d, -f2 | sed 's/^ *//' | sort | uniq -c | awk '{ c = $1; $1 = ""; printf "%s%dx%s", (NR > 1 ? ", " : ""), c, $0 }')
persistent=$(echo "$smi" | cut -s -d, -f3 | grep -c Enabled)
echo "== $(date '+%Y-%m-%d %H:%M %Z'); driver ${driver:-unknown (nvidia-smi failed)}; the host's GPUs: ${names:-unknown}; persistence mode on ${persistent} of them"
[ "$persistent" = 0 ] || echo "   (with persistence mode on, the driver stays initialised: the 'cold' tables are warm too)"

build=$(mktemp -d)
# Starts the holder and waits until it holds its contexts (its word on stdout, 30 s at most).
hold() {
  "$holder" "$$" >"$build/holder.out" 2>&1 &
  holder_pid=$!
  for _ in $(seq 600); do
    grep -q '^holding' "$build/holder.out" && return 0
    kill -0 "$holder_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "-- the context holder did not start (warm measurements left out): $(tr '\n' ' ' <"$build/holder.out")"
  kill "$holder_pid" 2>/dev/null; wait "$holder_pid" 2>/dev/null; holder_pid=
  return 1
}
# Ends the holder, by its pid, and waits for its exit (its contexts gone with it); says so where it had
# ended by itself, before its section did.
release() {
  [ -n "$holder_pid" ] || return 0
  kill "$holder_pid" 2>/dev/null || echo "-- (the context holder had ended before its section did: not all of it was warm)"
  wait "$holder_pid" 2>/dev/null
  holder_pid=
}
holder_pid=; mps=; mps_up=0
# Ends what this script started, whichever way it ends: the context holder (by its pid) and the MPS daemon.
cleanup() {
  release
  [ "$mps_up" = 0 ] || echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" nvidia-cuda-mps-control
  rm -rf "$build" ${mps:+"$mps"}
}
trap cleanup EXIT
floor=$build/ipc-floor
# shellcheck disable=SC2086 # FLOOR_ARCH may be several flags
if ! "${NVCC:-nvcc}" -O2 ${FLOOR_ARCH:--arch=native} -o "$floor" "$repo/scripts/floor/ipc-floor.cu"; then
  echo "compare.sh: building scripts/floor/ipc-floor.cu with ${NVCC:-nvcc} failed" >&2
  exit 1
fi
# The context holder: a context on every visible GPU, then nothing until it is ended. It dies with this
# script also where the trap cannot run (SIGKILL), and starts only as this script's child.
holder=$build/context-holder
cat >"$holder.cu" <<'EOF'
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (argc < 2 || getppid() != (pid_t)atol(argv[1])) return 1;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    for (int d = 0; d < count; d++) {
        cudaError_t e = cudaSetDevice(d);
        if (e == cudaSuccess) e = cudaFree(0);
        if (e != cudaSuccess) {
            fprintf(stderr, "no context on device %d: %s\n", d, cudaGetErrorString(e));
            return 1;
        }
    }
    printf("holding %d\n", count);
    fflush(stdout);
    for (;;) pause();
}
EOF
if ! "${NVCC:-nvcc}" -O2 -o "$holder" "$holder.cu"; then
  echo "compare.sh: building the context holder with ${NVCC:-nvcc} failed" >&2
  exit 1
fi
# GPUS: how many GPUs the programs see (nvidia-smi ignores CUDA_VISIBLE_DEVICES, so say it with it).
gpus=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)}
ms() { local a b; a=$(date +%s%N); "$@" >"$build/out" 2>&1; local rc=$?; b=$(date +%s%N); echo $(( (b - a) / 1000000 )) $rc; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
# What a state means, for the tables' headings; cold says whether other processes hold contexts.
state_says() {
  if [ "$1" = warm ]; then
    echo "warm: the holder keeps a context on each GPU"
  else
    local others
    others=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c .)
    if [ "$others" = 0 ]; then echo "cold: no other process holds a context"
    else echo "cold? $others other process(es) hold contexts"; fi
  fi
}

echo "== $gpus GPU(s); $rounds paired rounds each; medians in ms; sections in turn: $states"
# Removes what a run of the original left in /dev/shm (its segment and the driver's event files: the names
# that appeared since $1 was listed).
clean_original() {
  for f in $(comm -13 <(echo "$1") <(ls /dev/shm) | grep -E '^(simpleIPCshm[0-9]+|cuda\.shm\..*)$'); do rm -f "/dev/shm/$f"; done
}
if [ "$original" != - ]; then
  echo "-- NVIDIA's simpleIPC, one run's output:"
  before=$(ls /dev/shm)
  "$original" 2>&1 | sed 's/^/   /'
  echo "   (left in /dev/shm: $(comm -13 <(echo "$before") <(ls /dev/shm) | tr '\n' ' '))"
  clean_original "$before"
  echo "-- simple-ipc, one run's output:"
  "$ours" 2>&1 | sed 's/^/   /'
else
  echo "-- (no NVIDIA sample given: the comparison with the original is left out)"
fi

# The paired comparisons in one state of the driver, $1: cold or warm.
sections() {
  local says n ipc o s f l m t rc bad mo msi mf ms_ ml mm
  says=$(state_says "$1")
  if [ "$original" != - ]; then
    o=(); s=(); bad=0
    for _ in $(seq "$rounds"); do
      before=$(ls /dev/shm)
      read -r t rc < <(ms "$original"); o+=("$t"); [ "$rc" = 0 ] || bad=1
      clean_original "$before"
      read -r t rc < <(ms "$ours"); s+=("$t"); [ "$rc" = 0 ] || bad=1
    done
    mo=$(echo "${o[*]}" | median); msi=$(echo "${s[*]}" | median)
    echo "-- NVIDIA's simpleIPC against simple-ipc ($says):"
    echo "original ${mo} ms, simple-ipc ${msi} ms: simple-ipc takes $(ratio "$msi" "$mo") of the original's time$([ $bad = 1 ] && echo ' (A RUN FAILED)')"
  fi

  echo "-- against the floor (ipc-floor N over the $gpus GPU(s)), whole runs ($says):"
  printf "%10s %12s %14s %8s\n" processes "floor, ms" "simple-ipc, ms" ratio
  for n in 1 2 4 8 16; do
    [ $((n % gpus)) = 0 ] || continue
    f=(); s=(); bad=0
    for _ in $(seq "$rounds"); do
      read -r t rc < <(ms "$floor" "$n"); f+=("$t"); [ "$rc" = 0 ] || bad=1
      read -r t rc < <(ms "$ours" --procs-per-device $((n / gpus))); s+=("$t"); [ "$rc" = 0 ] || bad=1
    done
    mf=$(echo "${f[*]}" | median); ms_=$(echo "${s[*]}" | median)
    printf "%10s %12s %14s %8s%s\n" "$n" "$mf" "$ms_" "$(ratio "$ms_" "$mf")" "$([ $bad = 1 ] && echo '  (A RUN FAILED)')"
  done

  echo "-- each IPC mechanism against legacy, whole runs (--procs-per-device 2; $says):"
  printf "%10s %12s %14s %8s\n" mechanism "legacy, ms" "mechanism, ms" ratio
  for ipc in vmm pool; do
    l=(); m=(); bad=0
    for _ in $(seq "$rounds"); do
      read -r t rc < <(ms "$ours" --ipc legacy --procs-per-device 2); l+=("$t"); [ "$rc" = 0 ] || bad=1
      read -r t rc < <(ms "$ours" --ipc "$ipc" --procs-per-device 2); m+=("$t"); [ "$rc" = 0 ] || bad=1
    done
    ml=$(echo "${l[*]}" | median); mm=$(echo "${m[*]}" | median)
    printf "%10s %12s %14s %8s%s\n" "$ipc" "$ml" "$mm" "$(ratio "$mm" "$ml")" "$([ $bad = 1 ] && echo '  (A RUN FAILED)')"
  done
}

for state in $states; do
  if [ "$state" = warm ]; then hold || continue; fi
  sections "$state"
  release
done

# Under MPS (a daemon of this script's own, private pipe and log directories, quit at the end), against the
# same runs without it, cold and warm: whole runs for 1, 4 and 16 processes (--ipc legacy). A daemon keeps
# the driver initialised, and it cannot come and go between runs without its server's start landing in
# them, so the three are measured in turn, each $rounds runs: without MPS cold (before the daemon starts,
# no holder), without MPS warm (the holder, no daemon), under MPS (the daemon, its server started by an
# untimed run, no holder); each run under MPS must say so. Prints "median bad" of $rounds runs with $1 processes per device ($2 "mps": each must say
# MPS).
runs() {
  local v=() bad=0 t rc
  for _ in $(seq "$rounds"); do
    read -r t rc < <(ms "$ours" --procs-per-device "$1"); v+=("$t"); [ "$rc" = 0 ] || bad=1
    [ "${2:-}" != mps ] || grep -q 'under MPS' "$build/out" || bad=1
  done
  echo "$(echo "${v[*]}" | median) $bad"
}
if command -v nvidia-cuda-mps-control >/dev/null; then
  mps=$(mktemp -d /tmp/simple-ipc-compare-mps-XXXXXX); mkdir -p "$mps/pipe" "$mps/log"
  counts=(); for n in 1 4 16; do [ $((n % gpus)) = 0 ] && counts+=("$n"); done
  declare -A cold=() warm=() under=() bad=()
  for n in "${counts[@]}"; do cold[$n]=-; warm[$n]=-; under[$n]=-; bad[$n]=0; done
  for state in $states; do
    if [ "$state" = warm ]; then CUDA_MPS_PIPE_DIRECTORY="$mps/none" hold || continue; fi
    for n in "${counts[@]}"; do
      read -r t b < <(CUDA_MPS_PIPE_DIRECTORY="$mps/none" runs $((n / gpus)))
      if [ "$state" = warm ]; then warm[$n]=$t; else cold[$n]=$t; fi
      [ "$b" = 0 ] || bad[$n]=1
    done
    release
  done
  if CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log" nvidia-cuda-mps-control -d; then
    mps_up=1
    for _ in $(seq 100); do [ -S "$mps/pipe/control" ] && break; sleep 0.05; done
    # One run, untimed, starts the daemon's server, as the holder is up before the warm runs.
    CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" "$ours" >/dev/null 2>&1
    for n in "${counts[@]}"; do
      read -r t b < <(CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" runs $((n / gpus)) mps)
      under[$n]=$t; [ "$b" = 0 ] || bad[$n]=1
    done
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" nvidia-cuda-mps-control
    mps_up=0
    for _ in $(seq 100); do [ -S "$mps/pipe/control" ] || break; sleep 0.05; done
  else
    echo "-- under MPS: nvidia-cuda-mps-control -d failed"
  fi
  echo "-- under MPS against without, whole runs (--ipc legacy), $rounds runs each, in turn: without MPS cold"
  echo "   (before the daemon, no other context), without MPS warm (the holder, no daemon), under MPS (the"
  echo "   daemon, which keeps the driver warm itself); MPS/cold: under MPS against a cold driver, MPS/warm:"
  echo "   against a warm one, what MPS itself changes:"
  printf "%10s %16s %16s %14s %9s %9s\n" processes "no MPS cold, ms" "no MPS warm, ms" "under MPS, ms" MPS/cold MPS/warm
  for n in "${counts[@]}"; do
    rc_=-; rw_=-
    [ "${cold[$n]}" = - ] || [ "${under[$n]}" = - ] || rc_=$(ratio "${under[$n]}" "${cold[$n]}")
    [ "${warm[$n]}" = - ] || [ "${under[$n]}" = - ] || rw_=$(ratio "${under[$n]}" "${warm[$n]}")
    printf "%10s %16s %16s %14s %9s %9s%s\n" "$n" "${cold[$n]}" "${warm[$n]}" "${under[$n]}" "$rc_" "$rw_" \
      "$([ "${bad[$n]}" = 1 ] && echo '  (A RUN FAILED or did not say MPS)')"
  done
fi
