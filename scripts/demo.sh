#!/usr/bin/env bash
# The main job on a fresh machine: install build prerequisites, build, and
# generate with the embedded default model (SmolLM2-135M-Instruct).
#   scripts/demo.sh ["your prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
cargo build --release --quiet
prompt="${1:-Write a haiku about the sea.}"
exec ./target/release/mlx-bun generate --prompt "$prompt" --max-tokens 128 --verbose
