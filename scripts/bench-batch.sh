#!/usr/bin/env bash
# Continuous batching benchmark: aggregate decode tok/s and TTFT p50/p95 at
# 1, 2, 4, 8 concurrent streaming clients, for our batch lane, our serial
# lane (--decode-concurrency 1), mlx-lm's server (the oracle environment) and
# llama.cpp's llama-server (built from the source in the pinned
# llama-cpp-python sdist, CPU only, cached), on the same model, in one run.
#
#   scripts/bench-batch.sh [--model DIR] [--gguf FILE] [--clients 1,2,4,8]
#                          [--max-tokens T] [--rounds R] [--no-llama]
# --model defaults to the float32 copy of the default model (made with
# `mlx-bun convert -d` when missing); --gguf to the default model's GGUF.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/mlx-bun"
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
ORACLE_PY="${MLX_BUN_ORACLE_PYTHON:-$CACHE/oracle-venv/bin/python}"
MODEL="" GGUF="$CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
CLIENTS=1,2,4,8 MAX_TOKENS=32 ROUNDS=1 LLAMA=1

while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --gguf) GGUF="$2"; shift 2 ;;
    --clients) CLIENTS="$2"; shift 2 ;;
    --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --no-llama) LLAMA=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
[ -x "$ORACLE_PY" ] || { echo "no oracle environment at $ORACLE_PY: run scripts/oracle/setup.sh" >&2; exit 1; }
"$BIN" generate --prompt hi -n 1 >/dev/null   # the default model and its GGUF
if [ -z "$MODEL" ]; then
  MODEL="$CACHE/test-models/smol-f32"
  [ -f "$MODEL/model.safetensors" ] || "$BIN" convert --gguf "$GGUF" -o "$MODEL" -d
fi

# llama.cpp's server, from the source vendored in the pinned sdist.
if [ "$LLAMA" = 1 ]; then
  LLAMA_SERVER="$(bash "$ROOT/scripts/llama-cpp.sh")/llama-server"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
WORK="$(mktemp -d)"
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
wait_up() { # URL SECONDS
  for _ in $(seq "$2"); do curl -fsS "$1/health" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "server at $1 did not come up" >&2; return 1
}
measure() { # NAME COMMAND...
  local name="$1"; shift
  local port; port="$(free_port)"
  "$@" --port "$port" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PID=$!
  wait_up "http://127.0.0.1:$port" 600 || { cat "$WORK/$name.err" >&2; exit 1; }
  python3 "$ROOT/scripts/bench_batch.py" --server "$name=http://127.0.0.1:$port" \
    --clients "$CLIENTS" --max-tokens "$MAX_TOKENS" --rounds "$ROUNDS" --out "$WORK/rows.jsonl"
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
}

echo "$(date -u +%Y-%m-%dT%H:%MZ) $(uname -srm), $(nproc) cores; model $MODEL; $MAX_TOKENS tokens per request"
measure "mlx-bun-batch" "$BIN" serve --model "$MODEL" --log-level warn --decode-concurrency 8
measure "mlx-bun-serial" "$BIN" serve --model "$MODEL" --log-level warn --decode-concurrency 1
mkdir -p "$WORK/hf"
HF_HUB_OFFLINE=1 HF_HUB_CACHE="$WORK/hf" measure "mlx_lm.server" "$ORACLE_PY" -m mlx_lm server \
  --model "$MODEL" --log-level WARNING --decode-concurrency 8
if [ "$LLAMA" = 1 ]; then
  measure "llama-server" "$LLAMA_SERVER" -m "$GGUF" -np 8 -c 8192 -t "$(nproc)" --log-disable
fi
echo
python3 "$ROOT/scripts/bench_batch.py" table "$WORK/rows.jsonl" mlx-bun-batch
