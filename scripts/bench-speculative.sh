#!/usr/bin/env bash
# Speculative decoding speed-up on this machine. Defaults: a float32 copy of
# the default model as target (float32 verification of n+1 tokens costs little
# more than one token with OpenBLAS), the 4-bit default model as model draft.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
cache="${MLX_BUN_CACHE:-$HOME/.cache/mlx-bun}"
target="$cache/test-models/smol-f32"
if [[ ! -f "$target/model.safetensors" ]]; then
  ./target/release/mlx-bun generate --prompt hi -n 1 >/dev/null
  ./target/release/mlx-bun convert --gguf "$cache/downloads/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$target" -d
fi
exec python3 scripts/bench_speculative.py --target "$target" --draft "$cache/models/SmolLM2-135M-Instruct" "$@"
