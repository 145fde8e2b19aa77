#!/usr/bin/env bash
# Generation speed of mlx-bun against mlx-lm on the same model and prompt:
# runs both alternately (A B A B), parses prompt tok/s, decode tok/s and peak
# memory from their --verbose output, prints medians and ratios.
#
# Usage: scripts/bench-generate.sh [--model DIR] [--runs N] [--max-tokens N] [--prompt TEXT]
# Default model: the embedded default model in the mlx-bun cache.
# Needs a release build (cargo build --release) and the oracle venv
# (created on first use by scripts/oracle/setup.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
model="$cache/models/SmolLM2-135M-Instruct"
runs=3
max_tokens=64
prompt="Write a short story about a robot who learns to paint."

usage() { sed -n '6,9p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) model="${2:?--model needs a directory}"; shift 2 ;;
        --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
        --max-tokens) max_tokens="${2:?--max-tokens needs a number}"; shift 2 ;;
        --prompt) prompt="${2:?--prompt needs text}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
for n in "$runs" "$max_tokens"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "error: $n is not a positive number" >&2; exit 2; }
done
if [[ ! -f "$model/config.json" ]]; then
    echo "error: $model is not a model directory (no config.json)" >&2
    exit 1
fi
binary="$root/target/release/mlx-bun"
if [[ ! -x "$binary" ]]; then
    echo "error: $binary missing; run cargo build --release first" >&2
    exit 1
fi
python="$("$root/scripts/oracle/setup.sh")"
# A private copy, so a rebuild of the shared target dir cannot swap it mid-run.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp "$binary" "$scratch/mlx-bun"
binary="$scratch/mlx-bun"

echo "model: $model"
echo "mlx-bun: $("$binary" --version)   mlx-lm: $("$python" -c 'import mlx_lm; print(mlx_lm.__version__)')"
"$python" "$root/scripts/bench_generate.py" \
    --model "$model" --oracle-python "$python" --binary "$binary" \
    --runs "$runs" --max-tokens "$max_tokens" --prompt "$prompt"
