#!/usr/bin/env bash
# The container matrix (--ipc all --isolate KINDS, default container,user) as it runs now (each row one
# isolated run, one exporter and one importer trying every handle, the rows at once: src/matrix/row,
# src/matrix/lanes.rs), against the matrix as it ran before issue 41, each cell a whole isolated run, one
# after another (SIMPLE_IPC_MATRIX_SERIAL=1), in one call: ROUNDS rounds (default 5), each round one run of each, in
# turn, so that a host's drift falls on both alike. Each run must exit 0 and both must print the same
# table, or the script says so and exits 1. It prints each run's wall time, the medians and their ratio,
# with the date and the driver first (nvidia-smi, where there is one), so that pasted figures carry them.
#   scripts/compare-matrix.sh SIMPLE_IPC [ROUNDS] [KINDS]
# On a machine without a GPU, SIMPLE_IPC_SIMULATE_GPUS=ok,ok (the simulation) times the process work only.
# Needs namespaces (root, or user namespaces), as the matrix does. Every run's output goes to a directory
# of its own under TMPDIR, removed at the end.
set -u
if [ $# -lt 1 ]; then
  echo "usage: scripts/compare-matrix.sh SIMPLE_IPC [ROUNDS] [KINDS]" >&2
  exit 1
fi
ours=$(realpath "$1"); rounds=${2:-5}; kinds=${3:-container,user}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sort -u | paste -sd/)
echo "== $(date '+%Y-%m-%d %H:%M %Z'); driver ${driver:-none (nvidia-smi failed)}; ${SIMPLE_IPC_SIMULATE_GPUS:+simulated GPUs: $SIMPLE_IPC_SIMULATE_GPUS; }--ipc all --isolate $kinds, $rounds rounds"

# Runs the matrix (with the environment given first), keeps its output in $out/$1, says "MS RC".
timed() {
  local name=$1; shift
  local a b rc
  a=$(date +%s%N)
  env "$@" "$ours" --ipc all --isolate "$kinds" --timeout 120 >"$out/$name" 2>&1; rc=$?
  b=$(date +%s%N)
  echo $(( (b - a) / 1000000 )) "$rc"
}
# The table, as the matrix printed it (its header to its verdict, the verdict left out: it has the time).
table() { sed -n '/^importer vs exporter/,$p' "$out/$1" | sed '$d'; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

bad=0; new=(); old=()
for round in $(seq "$rounds"); do
  read -r t rc < <(timed new -u SIMPLE_IPC_MATRIX_SERIAL); new+=("$t")
  [ "$rc" = 0 ] || { echo "-- round $round: the matrix exited $rc:"; tail -n 5 "$out/new"; bad=1; }
  read -r t rc < <(timed old SIMPLE_IPC_MATRIX_SERIAL=1); old+=("$t")
  [ "$rc" = 0 ] || { echo "-- round $round: the one-cell-at-a-time matrix exited $rc:"; tail -n 5 "$out/old"; bad=1; }
  if ! diff <(table new) <(table old) >"$out/diff"; then
    echo "-- round $round: the two matrices printed different tables:"; cat "$out/diff"; bad=1
  fi
done
echo "-- a run a row, at once (now):    ${new[*]} ms; median $(echo "${new[*]}" | median) ms"
echo "-- a run a cell, in turn (old):   ${old[*]} ms; median $(echo "${old[*]}" | median) ms"
awk -v a="$(echo "${new[*]}" | median)" -v b="$(echo "${old[*]}" | median)" \
  'BEGIN { printf "-- now / old: %.2fx (old / now: %.2fx)\n", a / b, b / a }'
echo "-- the table (now):"; table new | sed 's/^/    /'
exit $bad
