#!/usr/bin/env bash
# Proves that `cargo test` notices when the ordering the sample exists to show is broken: for each mutant
# below, a copy of the source with that one change must FAIL the protocol tests (which run on the
# asynchronous host simulation, no GPU needed). Exits 0 only if every mutant was caught.
#   scripts/ordering-mutants.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Each mutant: a name, the file it changes (the original's order in the story's child, the memops order in the
# tool's), and a sed script applied to that file.
mutants=(
  "no event wait or record in the round-robin|src/sample/child.rs|s/stream\.wait_for(&self\.0\[target\])/Ok(())/;s/stream\.record(&self\.0\[target\])/Ok(())/"
  "the round-robin waits on another buffer's event|src/sample/child.rs|s/stream\.wait_for(&self\.0\[target\])/stream.wait_for(\&self.0[(target + 1) % self.0.len()])/"
  "no wait for the last writer before the copy back|src/sample/child.rs|s/^ *order\.wait_for_writes(&stream, index, n)?;\$//"
  "no event record in the round-robin|src/sample/child.rs|s/stream\.record(&self\.0\[target\])/Ok(())/"
  "--sync memops: no flag wait|src/tool/memops.rs|s/stream\.wait_flag(&self\.0\[target\], step as u32)/Ok(())/"
  "--sync memops: the flag says one write more than was done|src/tool/memops.rs|s/stream\.write_flag(&self\.0\[target\], step as u32 + 1)/stream.write_flag(\&self.0[target], step as u32 + 2)/"
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
  rest=${mutant#*|}
  file=${rest%%|*}
  script=${rest#*|}
  copy
  sed -i "$script" "$work/tree/$file"
  if diff -q "$file" "$work/tree/$file" >/dev/null; then
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
