#!/usr/bin/env bash
# Hand-over latency on a CUDA host, from one run: the benchmark without and with MPS, and the round-robin
# phase with --sync memops against events.
#   scripts/handover.sh [BINARY] [ROUNDS]        (default: target/release/simple-ipc, 5 rounds)
# MPS is started with private pipe and log directories and stopped again at the end (its control daemon,
# nvidia-cuda-mps-control, must be installed); the runs under it set the same variables.
set -u
bin=$(realpath "${1:-target/release/simple-ipc}"); rounds=${2:-5}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# The mean of the children's round-robin phase of one run, in ms.
round_robin() {
  "$bin" "$@" --json /tmp/handover.json >/dev/null 2>&1 || { echo fail; return; }
  grep -o '"round_robin": [0-9.]*' /tmp/handover.json | awk '{ s += $2 } END { printf "%.3f", s / NR }'
}
# The round-robin phase with events and with memops, paired, at `--procs-per-device $1` (and any options).
compare_sync() {
  local ppd=$1; shift
  local e=() m=()
  for _ in $(seq "$rounds"); do
    e+=("$(round_robin --procs-per-device "$ppd" "$@")"); m+=("$(round_robin --procs-per-device "$ppd" --sync memops "$@")")
  done
  local me mm; me=$(echo "${e[*]}" | median); mm=$(echo "${m[*]}" | median)
  echo "round-robin at --procs-per-device $ppd: events ${me} ms, memops ${mm} ms: memops takes $(awk -v a="$mm" -v b="$me" 'BEGIN { printf "%.2fx", a / b }') of events ($*)"
}

echo "== one GPU (CUDA_VISIBLE_DEVICES=0), without MPS"
CUDA_VISIBLE_DEVICES=0 "$bin" --bench --bench-max-bytes 67108864 --json /tmp/bench-nomps.json | grep -v '^CP:'
CUDA_VISIBLE_DEVICES=0 compare_sync 8

echo "== all GPUs, without MPS"
"$bin" --bench --bench-max-bytes 1073741824 --json /tmp/bench-all.json | grep -v '^CP:'
compare_sync 4

if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/simple-ipc-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/simple-ipc-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  CUDA_VISIBLE_DEVICES=0 nvidia-cuda-mps-control -d && sleep 1
  echo "== one GPU, under MPS"
  CUDA_VISIBLE_DEVICES=0 "$bin" --bench --bench-max-bytes 67108864 | grep -v '^CP:'
  CUDA_VISIBLE_DEVICES=0 compare_sync 8
  a=$(date +%s%N); CUDA_VISIBLE_DEVICES=0 "$bin" --procs-per-device 4 >/dev/null; rc=$?; b=$(date +%s%N)
  echo "whole run, --procs-per-device 4 under MPS: exit $rc, $(( (b - a) / 1000000 )) ms"
  echo quit | nvidia-cuda-mps-control
  sleep 1
fi
a=$(date +%s%N); CUDA_VISIBLE_DEVICES=0 "$bin" --procs-per-device 4 >/dev/null; rc=$?; b=$(date +%s%N)
echo "whole run, --procs-per-device 4 without MPS: exit $rc, $(( (b - a) / 1000000 )) ms"
