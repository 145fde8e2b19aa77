#!/usr/bin/env bash
# Second-turn TTFT on a hybrid model (gated DeltaNet + attention), in one
# run: `mlx-bun serve` and `mlx_lm.server` (the pinned oracle) side by side
# on the same random Qwen3-Next-class model (made by mlx-lm's own class,
# scripts/oracle/make_hybrid_bench_model.py, with the default model's
# tokenizer), same machine, MLX's default CPU threads for both, rounds
# interleaved. Turn 1 is a ~2,000-token message; turn 2 sends the reply
# back with a short question.
#
#   scripts/bench-hybrid-prefix.sh [--words W] [--rounds R] [--json FILE]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/mlx-bun"
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
PY="$CACHE/oracle-venv/bin/python"
MODEL="$CACHE/models/hybrid-bench-qwen3-next"

[ -x "$BIN" ] || { echo "build first: cargo build --release --bin mlx-bun" >&2; exit 1; }
[ -x "$PY" ] || { echo "the oracle is missing: scripts/oracle/setup.sh" >&2; exit 1; }
export HF_HUB_OFFLINE=1
if [ ! -f "$MODEL/model.safetensors" ]; then
  "$PY" "$ROOT/scripts/oracle/make_hybrid_bench_model.py" "$MODEL" \
    "$CACHE/models/SmolLM2-135M-Instruct"
fi

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" serve --port 0 --model "$MODEL" --log-level warn >"$WORK/ours.out" 2>"$WORK/ours.err" &
PIDS+=("$!")
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m mlx_lm server --model "$MODEL" --port "$PORT" >"$WORK/peer.out" 2>"$WORK/peer.err" &
PIDS+=("$!")

OURS=""
for _ in $(seq 600); do
  OURS="$(grep -o 'http://[0-9.:]*' "$WORK/ours.out" 2>/dev/null | head -1 || true)"
  [ -n "$OURS" ] && break
  sleep 0.2
done
[ -n "$OURS" ] || { cat "$WORK/ours.err" >&2; exit 1; }
PEER="http://127.0.0.1:$PORT"
for _ in $(seq 600); do
  curl -sf "$PEER/v1/models" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -sf "$PEER/v1/models" >/dev/null || { cat "$WORK/peer.err" >&2; exit 1; }

echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  machine: $(nproc) cores, $(uname -m)  model: $MODEL"
"$PY" "$ROOT/scripts/bench_hybrid_prefix.py" --server "mlx-bun=$OURS" --server "mlx-lm=$PEER" "$@"
