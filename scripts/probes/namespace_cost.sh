#!/usr/bin/env bash
# Probe: what a container made by hand costs the kernel alone (root): the wall time of
# `unshare --pid --fork --mount-proc --mount --ipc --uts` with its own /dev/shm and hostname around `true`
# (made, entered, torn down), one at a time and two at once (as served-containers.sh starts its joiners),
# against `sh -c true` with no namespace. ROUNDS (default 5) of each; prints the medians in ms.
#   scripts/probes/namespace_cost.sh [ROUNDS]
set -u
rounds=${1:-5}
now() { date +%s%N; }
median() { tr ' ' '\n' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
container() {
  unshare --pid --fork --mount-proc --mount --ipc --uts sh -c \
    'mount -t tmpfs -o size=64m tmpfs /dev/shm && hostname joiner && exec true'
}
none=(); one=(); two=()
for _ in $(seq "$rounds"); do
  a=$(now); sh -c true; b=$(now); none+=($(( (b - a) / 1000 )))
  a=$(now); container; b=$(now); one+=($(( (b - a) / 1000 )))
  a=$(now); container & container & wait; b=$(now); two+=($(( (b - a) / 1000 )))
done
echo "no namespace: $(echo "${none[*]}" | median) us; one container: $(echo "${one[*]}" | median) us; two at once: $(echo "${two[*]}" | median) us (medians of $rounds; each: ${one[*]} / ${two[*]} us)"
