#!/usr/bin/env bash
# Peak RSS and wall time of `mlx-bun convert` vs `mlx_lm.convert` on the same
# Hugging Face style input (the default model's float weights, two shards),
# in one run, alternating the two tools. Prints a Markdown table.
#
# Usage: scripts/bench-convert.sh [float32|bfloat16] [REPEATS]
# Needs: target/release/mlx-bun, the oracle venv (scripts/oracle/setup.sh),
# the float32 test model (made by the test helper float32_model(); or run
# `cargo test --release --test convert_hf` once), /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."
DTYPE=${1:-float32}
REPEATS=${2:-2}
PY=${MLX_BUN_ORACLE_PYTHON:-$HOME/.cache/mlx-bun/oracle-venv/bin/python}
SRC=${MLX_BUN_BENCH_SRC:-$HOME/.cache/mlx-bun/test-models/smol-f32}
BIN=./target/release/mlx-bun
export HF_HUB_OFFLINE=1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ -x "$BIN" ] || { echo "build first: cargo build --release --bin mlx-bun" >&2; exit 1; }
[ -x "$PY" ] || { echo "no oracle python at $PY (scripts/oracle/setup.sh)" >&2; exit 1; }
[ -f "$SRC/model.safetensors" ] || { echo "no float model at $SRC" >&2; exit 1; }

"$PY" scripts/oracle/make_hf_float.py "$SRC" "$WORK/hf" "$DTYPE"
echo "input: $(du -sh "$WORK/hf" | cut -f1) $DTYPE, $(ls "$WORK/hf"/*.safetensors | wc -l) shards" >&2

# Runs a command under /usr/bin/time; prints "seconds peak_MB".
measure() {
  local log="$WORK/time.log"
  /usr/bin/time -v "$@" >"$WORK/out.log" 2>"$log" || { cat "$WORK/out.log" "$log" >&2; exit 1; }
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  rss=$(grep "Maximum resident set size" "$log" | awk '{print $NF}')
  echo "$wall $((rss / 1024))"
}

echo "| case | tool | wall s | peak RSS MB |"
echo "|---|---|---|---|"
for case in "q4:-q" "q8:-q --q-bits 8" "bf16:--dtype bfloat16"; do
  name=${case%%:*}
  flags=${case#*:}
  for i in $(seq "$REPEATS"); do
    rm -rf "$WORK/theirs" "$WORK/ours"
    # shellcheck disable=SC2086
    read -r t m < <(measure "$PY" -m mlx_lm convert --hf-path "$WORK/hf" --mlx-path "$WORK/theirs" $flags)
    echo "| $name | mlx_lm.convert | $t | $m |"
    # shellcheck disable=SC2086
    read -r t m < <(measure "$BIN" convert --hf-path "$WORK/hf" --mlx-path "$WORK/ours" $flags)
    echo "| $name | mlx-bun convert | $t | $m |"
  done
done
