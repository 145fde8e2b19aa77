#!/usr/bin/env bash
# Prints the folder of llama.cpp's binaries (llama-bench, llama-server),
# building them once from the source vendored in the pinned
# llama-cpp-python sdist (CPU only, native ISA), cached under the mlx-bun
# cache. Build output goes to stderr.
set -euo pipefail
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
LLAMA_VERSION=0.3.36
DIR="$CACHE/llama.cpp-$LLAMA_VERSION"
BIN="$DIR/build/bin"
if [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-server" ]; then
  echo "building llama.cpp from llama-cpp-python==$LLAMA_VERSION's sources (minutes, once)" >&2
  if [ ! -f "$DIR/CMakeLists.txt" ]; then
    src="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --no-binary :all: \
      "llama-cpp-python==$LLAMA_VERSION" -d "$src" >&2
    tar -xzf "$src"/llama_cpp_python-*.tar.gz -C "$src"
    mkdir -p "$DIR"
    cp -r "$src"/llama_cpp_python-*/vendor/llama.cpp/. "$DIR/"
    rm -rf "$src"
  fi
  cmake -S "$DIR" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON >&2
  cmake --build "$DIR/build" --target llama-server llama-bench -j "$(nproc)" >&2
fi
echo "$BIN"
