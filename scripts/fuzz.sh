#!/usr/bin/env bash
# Runs every libFuzzer target in fuzz/ for N seconds (default 60) and copies
# each crashing input into fuzz/regressions/<target>/, which
# tests/fuzz_regressions.rs replays in a normal `cargo test`.
#   scripts/fuzz.sh [seconds] [target ...]
# Needs cargo-fuzz (`cargo install cargo-fuzz`). cargo-fuzz uses nightly-only
# compiler flags; on a stable toolchain RUSTC_BOOTSTRAP=1 enables them.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(gguf safetensors_header chat_template request_json json_schema)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "error: cargo-fuzz is missing: cargo install cargo-fuzz" >&2
  exit 1
fi
if ! rustc --version | grep -q nightly; then
  export RUSTC_BOOTSTRAP=1
fi

# The json_schema target compiles against the default model's tokenizer.
cache="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
if [[ ! -f "$cache/models/SmolLM2-135M-Instruct/tokenizer.json" ]]; then
  cargo build --release --bin mlx-bun
  ./target/release/mlx-bun generate --prompt Hi --max-tokens 1 >/dev/null
fi

# Pure-Rust parsers: panics, hangs and memory blow-ups are what we look for,
# so no sanitizer (several times more executions per second).
flags=(--release --debug-assertions --sanitizer none)
echo "fuzz: building the targets (the first build compiles every dependency, ~10 minutes)" >&2
cargo fuzz build "${flags[@]}"

status=0
for t in "${targets[@]}"; do
  work="fuzz/work/$t"
  artifacts="fuzz/artifacts/$t"
  mkdir -p "$work" "$artifacts" "fuzz/regressions/$t"
  echo "fuzz: $t for ${seconds}s" >&2
  log="fuzz/work/$t.log"
  # New corpus entries go to fuzz/work (ignored); the committed seeds are read only.
  if cargo fuzz run "${flags[@]}" "$t" "$work" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -max_len=65536 \
      -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
    :
  else
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE" "$log" | sed "s/^/fuzz: $t: /" >&2 || true
  for crash in "$artifacts"/*; do
    [[ -f "$crash" ]] || continue
    name="$(basename "$crash")"
    cp "$crash" "fuzz/regressions/$t/$name"
    echo "fuzz: $t: FOUND $name (copied to fuzz/regressions/$t/; see $log)" >&2
    status=1
  done
done
exit "$status"
