set -u
B=target/release/simple-ipc
t() { local s=$(date +%s.%N); "$@" > $OUT/$(echo "$*" | tr -c 'a-z0-9' '_' | cut -c1-60).log 2>&1; local rc=$?; echo "rc=$rc $(echo "$(date +%s.%N) - $s" | bc)s: $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t $B
t $B --procs-per-device 4 --ipc vmm
t $B --ipc all
t $B --ipc all --isolate container,user
t $B --isolate pid --ipc vmm --sync memops --procs-per-device 2
t $B --bench --bench-max-bytes 1048576
t $B --ipc pool --procs-per-device 2 --json $OUT/pool.json
sed -n '/^importer vs exporter/,$p' $OUT/*isolate_container_user*.log
tail -2 $OUT/*bench*.log
ls /dev/shm | grep -c cuda
