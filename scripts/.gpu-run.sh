set -u
start=$(date +%s)
timeout 290 scripts/gpu-check.sh target/release/simple-ipc > $OUT/check.log 2>&1; echo "check rc $? in $(( $(date +%s) - start )) s"
grep -E "^(PASS|FAIL)|summary" $OUT/check.log | cut -c1-200
