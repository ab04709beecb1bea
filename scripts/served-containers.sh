#!/usr/bin/env bash
# A served run across containers made by hand, against a plain run of the same work, in one call: the
# server where the user is, and two joiners, each in PID, mount, IPC and UTS namespaces of its own with a
# /dev/shm of its own (unshare: what a container has), over a path socket; --ipc vmm --sync memops (what
# crosses every boundary of Docker's defaults), two processes. ROUNDS rounds (default 5), each one plain run
# and one served run in turn; prints each wall time (start of the first process to the exit of the last),
# the medians and the ratio, with the date and the driver, and each run's phases from its --json (where the
# extra time goes). Root, for the namespaces.
#   scripts/served-containers.sh SIMPLE_IPC [ROUNDS]
set -u
if [ $# -lt 1 ]; then
  echo "usage: scripts/served-containers.sh SIMPLE_IPC [ROUNDS]" >&2
  exit 1
fi
bin=$(realpath "$1"); rounds=${2:-5}
out=$(mktemp -d)
chmod 755 "$out"
trap 'rm -rf "$out"' EXIT
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sort -u | paste -sd/)
echo "== $(date '+%Y-%m-%d %H:%M %Z'); driver ${driver:-none}; --ipc vmm --sync memops, 2 processes, $rounds rounds"
args=(--ipc vmm --sync memops --timeout 60)
now() { date +%s%N; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# A joiner in a container made by hand: its own PID, mount (with its own /dev/shm), IPC and UTS namespaces.
contained_joiner() {
  unshare --pid --fork --mount-proc --mount --ipc --uts sh -c \
    'mount -t tmpfs -o size=64m tmpfs /dev/shm && hostname joiner && exec "$@"' sh \
    "$bin" --join "$1" --timeout 60 >"$2" 2>&1
}
plain=(); served=(); bad=0
for round in $(seq "$rounds"); do
  a=$(now)
  "$bin" "${args[@]}" --procs-per-device 2 --json "$out/plain.json" >"$out/plain.log" 2>&1 || { echo "plain run failed:"; tail -3 "$out/plain.log"; bad=1; }
  b=$(now); plain+=($(( (b - a) / 1000000 )))
  socket="$out/run.sock"
  a=$(now)
  "$bin" "${args[@]}" --procs-per-device 2 --serve "$socket" --json "$out/served.json" >"$out/served.log" 2>&1 &
  server=$!
  contained_joiner "$socket" "$out/j1.log" &
  j1=$!
  contained_joiner "$socket" "$out/j2.log" &
  j2=$!
  wait "$server" || { echo "served run failed:"; tail -3 "$out/served.log"; bad=1; }
  wait "$j1" "$j2" || { echo "a joiner failed:"; tail -3 "$out/j1.log" "$out/j2.log"; bad=1; }
  b=$(now); served+=($(( (b - a) / 1000000 )))
  echo "-- round $round: plain ${plain[-1]} ms, served across containers ${served[-1]} ms"
done
p=$(echo "${plain[*]}" | median); s=$(echo "${served[*]}" | median)
echo "== medians: plain $p ms, served across containers $s ms: $(awk -v s="$s" -v p="$p" 'BEGIN { printf "%.2f", s / p }')x"
# Where the time went, from the last round's documents: the parent's (the server's) phases, ms.
python3 - "$out/plain.json" "$out/served.json" <<'EOF'
import json, sys
for name, path in zip(("plain", "served"), sys.argv[1:]):
    try:
        run = json.load(open(path))["run"]
    except (OSError, ValueError, KeyError) as e:
        print(f"   {name}: no phases ({e})")
        continue
    parent = run.get("parent") or {}
    phases = parent.get("phases_ms") or parent.get("phases") or parent
    print(f"   {name} parent phases: " + json.dumps(phases)[:400])
EOF
exit $bad
