#!/usr/bin/env bash
# The forecast against the libraries themselves, on a CUDA host with PyTorch, as root (unshare makes the
# namespaces of each cell): PyTorch's own sharing of a tensor (the default allocator, and
# expandable_segments:True) between two processes in each cell of the namespace matrix, beside what a served
# run of simple-ipc in the same two places forecast; with two GPUs, NCCL's transport too.
#   scripts/library-check.sh [BINARY]        (default: target/release/simple-ipc)
# Exit status: 0 if every forecast agreed with the library (or was "not known"), 1 on any disagreement,
# 2 where this host cannot run it (no root, no unshare, no PyTorch with CUDA).
set -u
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-target/release/simple-ipc}")
[ -x "$bin" ] || { echo "no executable at $bin (build with: cargo build --release)"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "library check: needs root (unshare makes each cell's namespaces)"; exit 2; }
command -v unshare >/dev/null || { echo "library check: needs unshare(1)"; exit 2; }
python=${PYTHON:-python3}
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "library check: needs PyTorch with CUDA ($python)"; exit 2
fi
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then export LIBRARY_CHECK_NCCL=1; fi
exec "$python" scripts/library_check.py "$bin"
