#!/usr/bin/env bash
# The test suite on a fresh machine: prerequisites, the pinned oracle
# environment (mlx-lm on the same MLX), the default model, then every test.
#   scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if [[ -x scripts/oracle/setup.sh ]]; then
  bash scripts/oracle/setup.sh >/dev/null
fi
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
