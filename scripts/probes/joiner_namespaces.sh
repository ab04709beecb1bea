#!/usr/bin/env bash
# Probe: which of a hand-made container's namespaces makes its joiner end late. A served run (--ipc vmm
# --sync memops, 2 processes) with two joiners, each started by `unshare` with one kind of namespace at a time
# (pid, mount with its own /dev/shm, ipc, uts), then all of them, and none; ROUNDS rounds (default 5) of each.
# Prints, per kind, the median wall time and the median of how long after the server the last joiner ended.
# Root.
#   scripts/probes/joiner_namespaces.sh SIMPLE_IPC [ROUNDS]
set -u
bin=$(realpath "$1"); rounds=${2:-5}
out=$(mktemp -d); chmod 755 "$out"; trap 'rm -rf "$out"' EXIT
now() { date +%s%N; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
joiner() { # joiner KIND NAME
  local join=("$bin" --join "$out/run.sock" --timeout 60)
  case $1 in
    none) "${join[@]}" ;;
    pid) unshare --pid --fork --mount-proc "${join[@]}" ;;
    mount) unshare --mount sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"' sh "${join[@]}" ;;
    ipc) unshare --ipc "${join[@]}" ;;
    uts) unshare --uts "${join[@]}" ;;
    all) unshare --pid --fork --mount-proc --mount --ipc --uts sh -c \
      'mount -t tmpfs -o size=64m tmpfs /dev/shm && hostname joiner && exec "$@"' sh "${join[@]}" ;;
  esac >"$out/$2.log" 2>&1
  now >"$out/$2.end"
}
for kind in none pid mount ipc uts all; do
  walls=(); lates=()
  for _ in $(seq "$rounds"); do
    a=$(now)
    { "$bin" --ipc vmm --sync memops --timeout 60 --procs-per-device 2 --serve "$out/run.sock" >"$out/server.log" 2>&1
      now >"$out/server.end"; } &
    joiner "$kind" j1 & joiner "$kind" j2 & wait
    b=$(now)
    grep -q PASSED "$out/server.log" || { echo "$kind: the run failed:"; tail -2 "$out/server.log" "$out/j1.log"; }
    last=$(cat "$out/j1.end" "$out/j2.end" | sort -n | tail -1)
    walls+=($(( (b - a) / 1000000 ))); lates+=($(( (last - $(cat "$out/server.end")) / 1000000 )))
  done
  echo "$kind: wall $(echo "${walls[*]}" | median) ms; the last joiner ended $(echo "${lates[*]}" | median) ms after the server (${lates[*]})"
done
