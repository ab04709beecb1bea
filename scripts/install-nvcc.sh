#!/usr/bin/env bash
# Installs NVIDIA's CUDA 13.0 compiler from PyPI into a folder (default: .dev/cuda) on any x86-64 Linux
# machine, GPU or not, and prints the toolkit root (the folder with bin/nvcc) on its last line.
# Used by CI and by scripts/regenerate-ptx.sh; a machine with a CUDA install of its own does not need it.
set -euo pipefail
prefix=${1:-.dev/cuda}
python3 -m pip install --quiet --disable-pip-version-check --upgrade --target "$prefix" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 'nvidia-cuda-runtime==13.0.*' >&2
root=$(cd "$prefix/nvidia/cu13" && pwd)
# The wheels put libraries in lib/; CMake's FindCUDAToolkit looks for lib64 and for an unversioned libcudart.
[ -e "$root/lib64" ] || ln -s lib "$root/lib64"
[ -e "$root/lib/libcudart.so" ] || ln -s libcudart.so.13 "$root/lib/libcudart.so"
chmod +x "$root"/bin/* "$root"/nvvm/bin/* 2>/dev/null || true
echo "$root"
