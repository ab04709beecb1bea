#!/usr/bin/env bash
# Regenerates kernels/simple_kernel.ptx from kernels/simple_kernel.cu with nvcc 13.0: the PTX that build.rs
# embeds where no nvcc is found. With --check it writes nothing and fails if the committed file differs.
# NVCC names the compiler; otherwise nvcc on PATH, otherwise the PyPI toolkit (scripts/install-nvcc.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-$(command -v nvcc || true)}
if [ -z "$nvcc" ]; then nvcc="$(scripts/install-nvcc.sh | tail -n 1)/bin/nvcc"; fi
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
# compute_75 is the oldest virtual architecture nvcc 13 accepts; the driver JIT-compiles it for newer GPUs.
# No -lineinfo: it would write this checkout's absolute path into the file.
"$nvcc" -ptx -arch=compute_75 -o "$out/simple_kernel.ptx" kernels/simple_kernel.cu
if [ "${1:-}" = --check ]; then
  if ! diff -u kernels/simple_kernel.ptx "$out/simple_kernel.ptx"; then
    echo "kernels/simple_kernel.ptx is stale: run scripts/regenerate-ptx.sh" >&2; exit 1
  fi
  echo "kernels/simple_kernel.ptx matches what $("$nvcc" --version | tail -n 1) makes of the source"
else
  cp "$out/simple_kernel.ptx" kernels/simple_kernel.ptx
  echo "wrote kernels/simple_kernel.ptx"
fi
