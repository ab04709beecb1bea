#!/usr/bin/env bash
# Proves that `cargo test` notices when the ordering the sample exists to show is broken: for each mutant
# below, a copy of the source with that one change must FAIL the protocol tests (which run on the
# asynchronous host simulation, no GPU needed). Exits 0 only if every mutant was caught.
#   scripts/ordering-mutants.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Each mutant: a name, and a sed script applied to src/child.rs.
mutants=(
  "no event wait or record in the round-robin|s/Handover::Events(events) => stream\.wait_for(&events\[target\]),/Handover::Events(_) => Ok(()),/;s/Handover::Events(events) => stream\.record(&events\[target\]),/Handover::Events(_) => Ok(()),/"
  "the round-robin waits on another buffer's event|s/stream\.wait_for(&events\[target\])/stream.wait_for(\&events[(target + 1) % events.len()])/"
  "no wait for the last writer before the copy back|s/^ *handover\.before_writing(&stream, index, n)?;\$//"
  "no event record in the round-robin|s/Handover::Events(events) => stream\.record(&events\[target\]),/Handover::Events(events) => Ok(drop(events)),/"
  "--sync memops: no flag wait|s/Handover::Flags(flags) => stream\.wait_flag(&flags\[target\], step as u32),/Handover::Flags(_) => Ok(()),/"
  "--sync memops: the flag says one write more than was done|s/stream\.write_flag(&flags\[target\], step as u32 + 1)/stream.write_flag(\&flags[target], step as u32 + 2)/"
)
export CARGO_TARGET_DIR="$PWD/target/ordering-mutants"
# What git tracks, and nothing else: an untracked build directory in the tree (a target of another name) would
# be copied for each mutant. Tracked files deleted in the working tree are skipped.
copy() { rm -rf "$work/tree"; mkdir "$work/tree"; git ls-files -z --cached | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | xargs -0 cp --parents -t "$work/tree"; }
# The control: the copy as it is must pass, or a failure below would prove nothing.
copy
if ! (cd "$work/tree" && cargo test --quiet --test protocol >"$work/log" 2>&1); then
  echo "ordering mutants: the unmutated copy fails its tests:"; tail -n 30 "$work/log"; exit 1
fi
caught=0
for mutant in "${mutants[@]}"; do
  name=${mutant%%|*}
  script=${mutant#*|}
  copy
  sed -i "$script" "$work/tree/src/child.rs"
  if diff -q src/child.rs "$work/tree/src/child.rs" >/dev/null; then
    echo "ordering mutant NOT APPLIED (the source changed; update this script): $name"
    exit 1
  fi
  if (cd "$work/tree" && cargo test --quiet --test protocol >"$work/log" 2>&1); then
    echo "ordering mutant SURVIVED (the tests passed without it): $name"
    exit 1
  fi
  if ! grep -q "verification failed" "$work/log"; then
    echo "ordering mutant failed the tests, but not through verification: $name"; tail -n 30 "$work/log"; exit 1
  fi
  echo "ordering mutant caught: $name"
  caught=$((caught + 1))
done
echo "ordering mutants: $caught passed, 0 failed"
