#!/usr/bin/env bash
# NVRTC and the CUDA headers, from NVIDIA's pinned Python wheels, for
# checking on a machine without a GPU that mlx-bun's CUDA kernels compile
# (tests/cuda_nvrtc.rs, scripts/cuda/nvrtc_check.py). Prints the folder.
set -euo pipefail
NVRTC=12.9.86
RUNTIME=12.9.79
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
DIR="$CACHE/nvrtc-$NVRTC"
if [ ! -f "$DIR/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] || [ ! -f "$DIR/nvidia/cuda_runtime/include/cuda_bf16.h" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    "nvidia-cuda-nvrtc-cu12==$NVRTC" "nvidia-cuda-runtime-cu12==$RUNTIME" -d "$tmp"
  mkdir -p "$DIR"
  for wheel in "$tmp"/*.whl; do
    python3 -m zipfile -e "$wheel" "$DIR"
  done
fi
echo "$DIR"
