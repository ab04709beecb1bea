set -u
start=$(date +%s)
GPU_CHECK_NO_SANITIZER=1 timeout 330 scripts/gpu-check.sh target/release/simple-ipc > $OUT/check.log 2>&1; echo "check rc $? in $(( $(date +%s) - start )) s"
grep -E "^(PASS|FAIL)|summary" $OUT/check.log | cut -c1-220
sed -n '/^    importer vs exporter/,/^PASS --ipc all --isolate/p' $OUT/check.log
ls -d /usr/local/cuda*/samples ~/cuda-samples* /opt/cuda-samples* /root/*samples* 2>/dev/null | head
