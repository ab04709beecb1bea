#!/usr/bin/env bash
# Paired comparisons on a CUDA host, from one run: NVIDIA's simpleIPC against simple-ipc (each at its
# defaults), and the probe's floor (`ipc-floor floor2 N`, the least program doing the same IPC work) against
# simple-ipc with the same number of processes, for N = 1 (or the GPU count) up to 16; and each IPC
# mechanism against legacy.
#   scripts/compare.sh SIMPLE_IPC ORIGINAL IPC_FLOOR [ROUNDS]
# Build the other two on that host (keep their code out of this repository):
#   nvcc -O2 -I<cuda-samples>/Common -o /tmp/simpleIPC <cuda-samples>/Samples/0_Introduction/simpleIPC/simpleIPC.cu \
#        <cuda-samples>/Common/helper_multiprocess.cpp
#   nvcc -O2 -std=c++17 -o /tmp/ipc-floor ipc-floor.cu -lcuda
# The original leaves /dev/shm/simpleIPCshm<pid> and the driver's cuda.shm.* files behind at every run; this
# script removes exactly those.
set -u
ours=$(realpath "$1"); original=$(realpath "$2"); floor=$(realpath "$3"); rounds=${4:-5}
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

echo "-- against the floor (floor2 N, DEVS=$gpus, one connection each), whole runs:"
printf "%10s %12s %14s %8s\n" processes "floor2, ms" "simple-ipc, ms" ratio
for n in 1 2 4 8 16; do
  [ $((n % gpus)) = 0 ] || continue
  f=(); s=(); bad=0
  for _ in $(seq "$rounds"); do
    read -r t rc < <(CUDA_DEVICE_MAX_CONNECTIONS=1 DEVS=$gpus ms "$floor" floor2 "$n"); f+=("$t"); [ "$rc" = 0 ] || bad=1
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
