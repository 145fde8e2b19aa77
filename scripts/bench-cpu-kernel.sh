#!/usr/bin/env bash
# CPU speed of mlx-bun against mlx-lm and llama.cpp on the default model
# (SmolLM2-135M-Instruct: mlx-bun and mlx-lm on its MLX conversion, llama.cpp
# on the same GGUF): prompt and decode tok/s, medians and ratios, and the
# forward pass at 1 and 4 tokens with and without mlx-bun's CPU kernel.
#
# Usage: scripts/bench-cpu-kernel.sh [--runs N] [--max-tokens N] [--threads N] [--prompt TEXT]
# Needs a release build (cargo build --release --bin mlx-bun). The oracle venv
# and a llama-cpp-python venv (built from source, CPU only: minutes) are
# created on first use in the mlx-bun cache.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
runs=3
max_tokens=64
threads=2
prompt="Write a short story about a robot who learns to paint."
llama_version="0.3.36"

usage() { sed -n '7,10p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --max-tokens) max_tokens="${2:?--max-tokens needs a number}"; shift 2 ;;
        --threads) threads="${2:?--threads needs a number}"; shift 2 ;;
        --prompt) prompt="${2:?--prompt needs text}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
for n in "$runs" "$max_tokens" "$threads"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "error: $n is not a positive number" >&2; exit 2; }
done
binary="$root/target/release/mlx-bun"
if [[ ! -x "$binary" ]]; then
    echo "error: $binary missing; run cargo build --release --bin mlx-bun first" >&2
    exit 1
fi
# A private copy, so a rebuild of the shared target dir cannot swap it mid-run.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp "$binary" "$scratch/mlx-bun"
binary="$scratch/mlx-bun"

# The default model (converted on first use) and the GGUF it came from.
"$binary" generate --prompt Hi --max-tokens 1 >/dev/null
model="$cache/models/SmolLM2-135M-Instruct"
gguf="${MLX_BUN_DEFAULT_GGUF:-$cache/downloads/SmolLM2-135M-Instruct.Q4_1.gguf}"
[[ -f "$gguf" ]] || { echo "error: the default model's GGUF is not at $gguf" >&2; exit 1; }

oracle="$("$root/scripts/oracle/setup.sh")"

# llama-cpp-python, pinned, built from source for this CPU, in its own venv.
llama_venv="$cache/llama-cpp-venv"
llama="$llama_venv/bin/python"
if ! "$llama" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$llama_version')" 2>/dev/null; then
    echo "building llama-cpp-python $llama_version from source into $llama_venv (several minutes)" >&2
    python3 -m venv "$llama_venv"
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$llama" -m pip install --quiet --disable-pip-version-check "llama-cpp-python==$llama_version" >&2
fi

echo "model: $model"
echo "gguf: $gguf"
echo "mlx-bun: $("$binary" --version)   mlx-lm: $("$oracle" -c 'import mlx_lm; print(mlx_lm.__version__)')   llama-cpp-python: $llama_version ($threads threads)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
"$oracle" "$root/scripts/bench_cpu_kernel.py" \
    --model "$model" --gguf "$gguf" --oracle-python "$oracle" --llama-python "$llama" \
    --binary "$binary" --runs "$runs" --max-tokens "$max_tokens" --threads "$threads" \
    --prompt "$prompt"
