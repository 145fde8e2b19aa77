#!/usr/bin/env bash
# mlx-bun beside its peers, on one model, in one run: mlx-lm (the pinned
# oracle environment) and llama.cpp (built from the pinned llama-cpp-python
# sdist), the same thread count for all, rounds interleaved. Measures one
# sequence (prompt and decode tok/s on a random prompt) and serving to 1, 4
# and 8 streaming clients (aggregate tok/s, TTFT p50/p95). The samples and
# every command's output go into the eval database as one run of kind
# `peers`; the tables are printed by `mlx-bun evals report <run>`.
#
#   scripts/bench-peers.sh [--rounds 3] [--threads N] [--prompt-tokens 128]
#       [--generation-tokens 128] [--clients 1,4,8] [--serve-tokens 64]
#       [--scenarios generate,serve] [--model DIR --gguf FILE] [--with-int8]
# --with-int8 adds mlx-bun-int8: mlx-bun with MLX_BUN_CPU_INT8_DOT=1.
# Default model: the embedded default model (its MLX folder, and the GGUF it
# was made from for llama.cpp). Threads default to every core.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
BIN="$ROOT/target/release/mlx-bun"
MODEL="$CACHE/models/SmolLM2-135M-Instruct"
GGUF="$CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
THREADS="$(nproc)"
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --gguf) GGUF="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rounds|--prompt-tokens|--generation-tokens|--clients|--serve-tokens|--scenarios)
      PASS+=("$1" "$2"); shift 2 ;;
    --with-int8) PASS+=("$1"); shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

[ -x "$BIN" ] || { echo "build first: cargo build --release" >&2; exit 1; }
ORACLE_PY="$(bash "$ROOT/scripts/oracle/setup.sh")"
LLAMA_BIN="$(bash "$ROOT/scripts/llama-cpp.sh")"
"$BIN" generate --prompt hi -n 1 >/dev/null   # the default model and its GGUF
[ -f "$MODEL/config.json" ] || { echo "$MODEL is not a model folder" >&2; exit 1; }
[ -f "$GGUF" ] || { echo "no GGUF at $GGUF (--gguf)" >&2; exit 1; }

# A private copy, so a rebuild cannot swap the binary mid-run.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp "$BIN" "$WORK/mlx-bun"
OUT="$ROOT/target/bench-peers/$(date -u +%Y%m%dT%H%MZ)"
mkdir -p "$OUT"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(uname -srm); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "mlx-bun: $("$WORK/mlx-bun" --version); mlx-lm: $("$ORACLE_PY" -c 'import mlx_lm; print(mlx_lm.__version__)'); llama.cpp: llama-cpp-python 0.3.36 sources"
  echo "command: scripts/bench-peers.sh --threads $THREADS ${PASS[*]:-}"
} | tee "$OUT/provenance.txt"

python3 "$ROOT/scripts/bench_peers.py" --binary "$WORK/mlx-bun" --oracle-python "$ORACLE_PY" \
  --llama-bin "$LLAMA_BIN" --model "$MODEL" --gguf "$GGUF" --threads "$THREADS" \
  --out "$OUT" "${PASS[@]}"

flags="$(python3 -c 'import json,sys; print(json.dumps({"threads": int(sys.argv[1]), "args": sys.argv[2:]}))' \
  "$THREADS" "${PASS[@]}")"
run="$("$WORK/mlx-bun" evals import "$OUT/metrics.jsonl" --kind peers --label cpu \
  --model "$MODEL" --flags "$flags" --logs "$OUT/logs" --note "$OUT/provenance.txt")"
echo
"$WORK/mlx-bun" evals report "$run"
