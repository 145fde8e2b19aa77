#!/usr/bin/env bash
# Serving benchmark: N concurrent streaming clients against `mlx-bun serve`
# and against mlx-lm's server (the oracle environment) on the same model,
# rounds interleaved. Reports TTFT p50/p95, per-stream and aggregate decode
# tok/s, and TTFT of a repeated long prompt (prompt-cache hit) vs cold.
#
#   scripts/bench-serve.sh [--model DIR] [--clients N] [--max-tokens T]
#                          [--rounds R] [--long-words W] [--ours-only]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/mlx-bun"
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
ORACLE_PY="${MLX_BUN_ORACLE_PYTHON:-$CACHE/oracle-venv/bin/python}"
MODEL="$CACHE/models/SmolLM2-135M-Instruct"
CLIENTS=4 MAX_TOKENS=16 ROUNDS=2 LONG_WORDS=30 OURS_ONLY=0

while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --long-words) LONG_WORDS="$2"; shift 2 ;;
    --ours-only) OURS_ONLY=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "no model at $MODEL (give --model DIR)" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_up() { # URL PATH SECONDS
  for _ in $(seq "$3"); do
    curl -fsS "$1$2" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "server at $1 did not come up" >&2
  return 1
}

OURS_PORT="$(free_port)"
"$BIN" serve --model "$MODEL" --port "$OURS_PORT" --log-level warn >"$WORK/ours.out" 2>"$WORK/ours.err" &
PIDS+=($!)
SERVERS=(--server "mlx-bun=http://127.0.0.1:$OURS_PORT")

if [ "$OURS_ONLY" = 0 ]; then
  [ -x "$ORACLE_PY" ] || { echo "no oracle environment at $ORACLE_PY (or pass --ours-only)" >&2; exit 1; }
  THEIRS_PORT="$(free_port)"
  mkdir -p "$WORK/hf"
  HF_HUB_OFFLINE=1 HF_HUB_CACHE="$WORK/hf" "$ORACLE_PY" -m mlx_lm server --model "$MODEL" \
    --port "$THEIRS_PORT" --log-level WARNING >"$WORK/theirs.out" 2>"$WORK/theirs.err" &
  PIDS+=($!)
  SERVERS+=(--server "mlx_lm.server=http://127.0.0.1:$THEIRS_PORT")
fi

wait_up "http://127.0.0.1:$OURS_PORT" /health 300
[ "$OURS_ONLY" = 1 ] || wait_up "http://127.0.0.1:$THEIRS_PORT" /health 300

echo "$(date -u +%Y-%m-%dT%H:%MZ) $(uname -srm), $(nproc) cores; model $MODEL"
python3 "$ROOT/scripts/bench_serve.py" "${SERVERS[@]}" --clients "$CLIENTS" \
  --max-tokens "$MAX_TOKENS" --rounds "$ROUNDS" --long-words "$LONG_WORDS" --json "$WORK/raw.json"
