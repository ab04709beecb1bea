#!/usr/bin/env bash
# A served run across containers made by hand, against a plain run of the same work and a served run whose
# joiners are where the user is (what serving costs apart from the containers), in one call: the
# server where the user is, and two joiners, each in PID, mount, IPC and UTS namespaces of its own with a
# /dev/shm of its own (unshare: what a container has), over a path socket; --ipc vmm --sync memops (what
# crosses every boundary of Docker's defaults), two processes. ROUNDS rounds (default 5), each one plain run
# and the two served runs in turn; prints each wall time (start of the first process to the exit of the last),
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
# A joiner where the user is (no namespace of its own): what serving costs without the containers.
plain_joiner() {
  "$bin" --join "$1" --timeout 60 >"$2" 2>&1
}
# A joiner in a container made by hand: its own PID, mount (with its own /dev/shm), IPC and UTS namespaces.
contained_joiner() {
  unshare --pid --fork --mount-proc --mount --ipc --uts sh -c \
    'mount -t tmpfs -o size=64m tmpfs /dev/shm && hostname joiner && exec "$@"' sh \
    "$bin" --join "$1" --timeout 60 >"$2" 2>&1
}
plain=(); near=(); served=(); ends=(); bad=0
# One served run, its joiners started by $1 (plain_joiner or contained_joiner), named $2; prints its ms.
served_run() {
  local joiner=$1 name=$2 socket="$out/run.sock" a b server j1 j2
  a=$(now)
  { "$bin" "${args[@]}" --procs-per-device 2 --serve "$socket" --json "$out/$name.json" >"$out/$name.log" 2>&1
    echo $? >"$out/$name.rc"; now >"$out/$name.end"; } &
  server=$!
  { $joiner "$socket" "$out/$name-j1.log"; echo $? >"$out/$name-j1.rc"; now >"$out/$name-j1.end"; } &
  j1=$!
  { $joiner "$socket" "$out/$name-j2.log"; echo $? >"$out/$name-j2.rc"; now >"$out/$name-j2.end"; } &
  j2=$!
  wait "$server" "$j1" "$j2"
  b=$(now)
  [ "$(cat "$out/$name.rc")" = 0 ] || { echo "$name run failed:" >&2; tail -3 "$out/$name.log" >&2; bad=1; }
  [ "$(cat "$out/$name-j1.rc" "$out/$name-j2.rc" | sort -u)" = 0 ] ||
    { echo "a joiner of the $name run failed:" >&2; tail -3 "$out/$name-j1.log" "$out/$name-j2.log" >&2; bad=1; }
  # When each ended, from the start (ms): where the last process's end comes after the server's.
  ends+=("$name: server $(( ($(cat "$out/$name.end") - a) / 1000000 )), joiners $(( ($(cat "$out/$name-j1.end") - a) / 1000000 )) and $(( ($(cat "$out/$name-j2.end") - a) / 1000000 ))")
  echo $(( (b - a) / 1000000 )) >"$out/$name.ms"
}
for round in $(seq "$rounds"); do
  a=$(now)
  "$bin" "${args[@]}" --procs-per-device 2 --json "$out/plain.json" >"$out/plain.log" 2>&1 || { echo "plain run failed:"; tail -3 "$out/plain.log"; bad=1; }
  b=$(now); plain+=($(( (b - a) / 1000000 )))
  ends=()
  served_run plain_joiner near; near+=($(cat "$out/near.ms"))
  served_run contained_joiner served; served+=($(cat "$out/served.ms"))
  echo "-- round $round: plain ${plain[-1]} ms, served to joiners where the user is ${near[-1]} ms, served across containers ${served[-1]} ms"
  echo "   ended at (ms): ${ends[0]}; ${ends[1]}"
done
p=$(echo "${plain[*]}" | median); n=$(echo "${near[*]}" | median); s=$(echo "${served[*]}" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "== medians: plain $p ms, served to joiners where the user is $n ms ($(ratio "$n" "$p")x), served across containers $s ms: $(ratio "$s" "$p")x"
# Where the time went, from the last round's documents: the parent's (the server's) phases, ms.
python3 - "$out/plain.json" "$out/near.json" "$out/served.json" <<'EOF'
import json, sys
for name, path in zip(("plain", "served near", "served across containers"), sys.argv[1:]):
    try:
        run = json.load(open(path))["run"]
    except (OSError, ValueError, KeyError) as e:
        print(f"   {name}: no phases ({e})")
        continue
    parent = run.get("parent") or {}
    phases = parent.get("phases_ms") or parent.get("phases") or parent
    print(f"   {name} parent phases: " + json.dumps(phases)[:400])
    for child in run.get("children") or []:
        print(f"   {name} process {child.get('index')}: " + json.dumps(child.get("phases"))[:400])
EOF
exit $bad
