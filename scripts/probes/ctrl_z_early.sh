#!/usr/bin/env bash
# Probe: Ctrl-Z (SIGTSTP to the process the user started) at a random moment 0-60 ms into a simulated
# isolated run; 0.5 s later, is every process of it stopped but the leaders of sessions (the inits that
# started their process, the guardian)? Prints each run that left one running (with its parent), and the
# count; continues and reaps each run. Load the host (busy loops) to widen the windows.
#   scripts/probes/ctrl_z_early.sh SIMPLE_IPC [RUNS] [ISOLATE]
bin=$1; n=${2:-30}; isolate=${3:-pid}
export SIMPLE_IPC_SIMULATE_GPUS=ok
desc() { local p=$1; for c in $(cat /proc/$p/task/*/children 2>/dev/null); do echo $c; desc $c; done; }
bad=0
for i in $(seq $n); do
  d=$(( RANDOM % 60 ))
  "$bin" --isolate $isolate --ipc vmm --sync memops --procs-per-device 2 --timeout 20 >/dev/null 2>&1 &
  top=$!
  sleep 0.0$(printf %02d $d)
  kill -TSTP $top
  sleep 0.5
  running=""
  for p in $top $(desc $top); do
    st=$(awk '{print $3, $6}' /proc/$p/stat 2>/dev/null) || continue
    state=${st%% *}; sess=${st##* }
    [ "$sess" = "$p" ] && continue
    case $state in T|t|Z) ;; *) pp=$(awk '{print $4}' /proc/$p/stat); running="$running $p:$state:$(tr '\0' ' ' </proc/$p/cmdline | cut -c1-40) parent $pp:$(awk '{print $3, "sess", $6}' /proc/$pp/stat) nspid $(grep NSpid /proc/$pp/status | cut -f2-) children of parent: $(cat /proc/$pp/task/*/children)";; esac
  done
  if [ -n "$running" ]; then echo "delay ${d}0 ms: running:$running"; bad=$((bad+1)); fi
  kill -CONT $top; wait $top; echo "  rc=$?" >/dev/null
done
echo "bad=$bad of $n"
