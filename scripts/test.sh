#!/usr/bin/env bash
# The test suite on a fresh machine: prerequisites, the pinned oracle
# environment (mlx-lm on the same MLX), the default model, then every test.
#   scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# A full build and the test data take about 4 GiB; a linker that runs out of
# disk dies with a bus error, so say it plainly first.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if (( free_kib < 6 * 1024 * 1024 )); then
  echo "warning: $((free_kib / 1024)) MiB free on the build disk; the build and tests need about 4 GiB" >&2
fi
if [[ -x scripts/oracle/setup.sh ]]; then
  bash scripts/oracle/setup.sh >/dev/null
fi
# NVRTC and the CUDA headers: the CUDA kernels must compile without a GPU.
bash scripts/cuda/nvrtc-setup.sh >/dev/null
# The pinned openai/anthropic clients the agent tests drive the server with.
bash scripts/clients-setup.sh >/dev/null
cargo fmt --check
cargo clippy --release --all-targets --quiet -- -D warnings
# The engine builds without the HTTP stack.
cargo clippy --release --lib --no-default-features --quiet -- -D warnings
cargo build --release --all-targets --quiet
# Prepare the default model once, before tests run in parallel.
./target/release/mlx-bun generate --prompt "Hi" --max-tokens 1 >/dev/null
cargo test --release "$@"
# The serving feature matrix, small: every cell against the real server.
smoke_dir=target/bench-smoke
rm -rf "$smoke_dir" && mkdir -p "$smoke_dir"
MLX_BUN_EVAL_DB="$smoke_dir/evals.db" ./target/release/mlx-bun bench feature-matrix \
  --smoke --out "$smoke_dir"
