#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian/Ubuntu machine: the
# compilers and libclang (bindgen) and CMake. MLX itself (the mlx-cpu wheel)
# is fetched by the build into the user cache; the default model on first use.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v clang >/dev/null 2>&1 || need+=(clang)
if ! compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null && ! ldconfig -p 2>/dev/null | grep -q libclang; then
  need+=(libclang-dev)
fi
# MLX's CPU backend calls BLAS for float matmuls; OpenBLAS makes them fast.
if ! compgen -G '/usr/lib/*/libopenblas.so.0' >/dev/null && ! compgen -G '/usr/lib*/libopenblas.so.0' >/dev/null; then
  need+=(libopenblas0-pthread)
fi
# tests/chat_page.rs drives the chat page in headless Chromium.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if ! python3 -m pip --version >/dev/null 2>&1; then
  need+=(python3-pip)
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi

if ((${#need[@]})); then
  echo "bootstrap: installing ${need[*]}" >&2
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "bootstrap: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
