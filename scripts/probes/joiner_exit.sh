#!/usr/bin/env bash
# Probe: where a contained joiner's last milliseconds go. A served run (--ipc vmm --sync memops, 2 processes)
# with two joiners, each in PID, mount, IPC and UTS namespaces of its own with its own /dev/shm, as
# served-containers.sh starts them, except that the joiner is not exec'd: the namespace's shell notes when
# the joiner ended (inside), and the script when unshare did (outside: the namespaces torn down). Prints,
# per round, from the start (ms): the server's end, each joiner's end inside and outside. Root.
#   scripts/probes/joiner_exit.sh SIMPLE_IPC [ROUNDS]
set -u
bin=$(realpath "$1"); rounds=${2:-3}
out=$(mktemp -d); chmod 755 "$out"; trap 'rm -rf "$out"' EXIT
now() { date +%s%N; }
joiner() { # joiner NAME
  unshare --pid --fork --mount-proc --mount --ipc --uts sh -c \
    'mount -t tmpfs -o size=64m tmpfs /dev/shm && hostname joiner && "$@"; rc=$?; date +%s%N >"$0"; exit $rc' \
    "$out/$1.inside" "$bin" --join "$out/run.sock" --timeout 60 >"$out/$1.log" 2>&1
  now >"$out/$1.outside"
}
for round in $(seq "$rounds"); do
  a=$(now)
  { "$bin" --ipc vmm --sync memops --timeout 60 --procs-per-device 2 --serve "$out/run.sock" >"$out/server.log" 2>&1
    now >"$out/server.end"; } &
  joiner j1 & joiner j2 & wait
  ms() { echo $(( ($(cat "$out/$1") - a) / 1000000 )); }
  echo "round $round: server $(ms server.end); joiner 1 inside $(ms j1.inside), outside $(ms j1.outside); joiner 2 inside $(ms j2.inside), outside $(ms j2.outside)"
done
