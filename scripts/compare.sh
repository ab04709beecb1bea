#!/usr/bin/env bash
# Paired comparisons on a CUDA host, from one run: NVIDIA's simpleIPC against simple-ipc (each at its
# defaults), and the project's floor (scripts/floor/ipc-floor.cu: the least program doing the same IPC work,
# events, kernel and copy back included) against simple-ipc with the same number of processes, for N = 1
# (or the GPU count) up to 16; each IPC mechanism against legacy; and, where nvidia-cuda-mps-control is
# found, whole runs under an MPS daemon of its own against the same runs without. It prints the date, the
# driver and the GPUs first, so that pasted figures carry them.
#   scripts/compare.sh SIMPLE_IPC ORIGINAL [ROUNDS]     (ORIGINAL "-": no NVIDIA sample on this host; the
#                                                     floor and the mechanisms are compared still)
# The floor is built here from the repository with nvcc (NVCC, or nvcc on PATH; FLOOR_ARCH, default
# -arch=native, picks its GPU code). NVIDIA's sample is built by hand on that host (keep its code out of
# this repository):
#   nvcc -O2 -I<cuda-samples>/Common -o /tmp/simpleIPC <cuda-samples>/Samples/0_Introduction/simpleIPC/simpleIPC.cu \
#        <cuda-samples>/Common/helper_multiprocess.cpp
# The original leaves /dev/shm/simpleIPCshm<pid> and the driver's cuda.shm.* files behind at every run; this
# script removes exactly those.
set -u
if [ $# -lt 2 ]; then
  echo "usage: scripts/compare.sh SIMPLE_IPC ORIGINAL [ROUNDS]" >&2
  exit 1
fi
ours=$(realpath "$1"); original=$2; rounds=${3:-5}
[ "$original" = - ] || original=$(realpath "$original")
repo=$(cd "$(dirname "$0")/.." && pwd)

# The host, first (nvidia-smi lists all of the host's GPUs, whatever CUDA_VISIBLE_DEVICES says).
smi=$(nvidia-smi --query-gpu=driver_version,name,persistence_mode --format=csv,noheader 2>/dev/null)
driver=$(echo "$smi" | cut -s -d, -f1 | sed 's/^ *//' | sort -u | paste -sd/)
names=$(echo "$smi" | cut -s -d, -f2 | sed 's/^ *//' | sort | uniq -c | awk '{ c = $1; $1 = ""; printf "%s%dx%s", (NR > 1 ? ", " : ""), c, $0 }')
persistent=$(echo "$smi" | cut -s -d, -f3 | grep -c Enabled)
echo "== $(date '+%Y-%m-%d %H:%M %Z'); driver ${driver:-unknown (nvidia-smi failed)}; the host's GPUs: ${names:-unknown}; persistence mode on ${persistent} of them"
[ "$persistent" = 0 ] || echo "   (with persistence mode on, the driver stays initialised between runs)"

build=$(mktemp -d); trap 'rm -rf "$build"' EXIT
floor=$build/ipc-floor
# shellcheck disable=SC2086 # FLOOR_ARCH may be several flags
if ! "${NVCC:-nvcc}" -O2 ${FLOOR_ARCH:--arch=native} -o "$floor" "$repo/scripts/floor/ipc-floor.cu"; then
  echo "compare.sh: building scripts/floor/ipc-floor.cu with ${NVCC:-nvcc} failed" >&2
  exit 1
fi
# GPUS: how many GPUs the programs see (nvidia-smi ignores CUDA_VISIBLE_DEVICES, so say it with it).
gpus=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)}
ms() { local a b; a=$(date +%s%N); "$@" >/tmp/compare.out 2>&1; local rc=$?; b=$(date +%s%N); echo $(( (b - a) / 1000000 )) $rc; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

echo "== $gpus GPU(s); $rounds paired rounds each; medians in ms"
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

o=(); s=(); bad=0
for _ in $(seq "$rounds"); do
  before=$(ls /dev/shm)
  read -r t rc < <(ms "$original"); o+=("$t"); [ "$rc" = 0 ] || bad=1
  clean_original "$before"
  read -r t rc < <(ms "$ours"); s+=("$t"); [ "$rc" = 0 ] || bad=1
done
mo=$(echo "${o[*]}" | median); msi=$(echo "${s[*]}" | median)
echo "original ${mo} ms, simple-ipc ${msi} ms: simple-ipc takes $(ratio "$msi" "$mo") of the original's time$([ $bad = 1 ] && echo ' (A RUN FAILED)')"
else
  echo "-- (no NVIDIA sample given: the comparison with the original is left out)"
fi

echo "-- against the floor (ipc-floor N over the $gpus GPU(s)), whole runs:"
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

echo "-- each IPC mechanism against legacy, whole runs (--procs-per-device 2):"
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

# Under MPS (a daemon of this script's own, private pipe and log directories, quit at the end), against the
# same run without: whole runs for 1, 4 and 16 processes, paired rounds; each run under MPS must say so.
if command -v nvidia-cuda-mps-control >/dev/null; then
  mps=$(mktemp -d /tmp/simple-ipc-compare-mps-XXXXXX); mkdir -p "$mps/pipe" "$mps/log"
  if CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log" nvidia-cuda-mps-control -d; then
    for _ in $(seq 100); do [ -S "$mps/pipe/control" ] && break; sleep 0.05; done
    echo "-- under MPS against without, whole runs (--ipc legacy):"
    printf "%10s %12s %14s %8s\n" processes "no MPS, ms" "under MPS, ms" ratio
    for n in 1 4 16; do
      [ $((n % gpus)) = 0 ] || continue
      w=(); u=(); bad=0
      for _ in $(seq "$rounds"); do
        read -r t rc < <(CUDA_MPS_PIPE_DIRECTORY="$mps/none" ms "$ours" --procs-per-device $((n / gpus))); w+=("$t"); [ "$rc" = 0 ] || bad=1
        read -r t rc < <(CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" ms "$ours" --procs-per-device $((n / gpus))); u+=("$t")
        { [ "$rc" = 0 ] && grep -q 'under MPS' /tmp/compare.out; } || bad=1
      done
      mw=$(echo "${w[*]}" | median); mu=$(echo "${u[*]}" | median)
      printf "%10s %12s %14s %8s%s\n" "$n" "$mw" "$mu" "$(ratio "$mu" "$mw")" "$([ $bad = 1 ] && echo '  (A RUN FAILED or did not say MPS)')"
    done
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" nvidia-cuda-mps-control
    for _ in $(seq 100); do [ -S "$mps/pipe/control" ] || break; sleep 0.05; done
  else
    echo "-- under MPS: nvidia-cuda-mps-control -d failed"
  fi
  rm -rf "$mps"
fi
