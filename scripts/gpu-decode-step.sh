#!/usr/bin/env bash
# Single-sequence decode on an NVIDIA GPU: what a step costs the host, and
# mlx-bun against mlx-lm 0.32.2 on the same random Llama-3-8B-shape 4-bit
# model, the same GPU and MLX. Run in phases on the GPU machine:
#
#   scripts/gpu-decode-step.sh setup   BUNDLE WHEELS TOKENIZER WORK
#   scripts/gpu-decode-step.sh kernels BUNDLE OUT      (bench qmv: narrow layers, launch shapes)
#   scripts/gpu-decode-step.sh attention BUNDLE OUT    (bench attention --check)
#   scripts/gpu-decode-step.sh decode  BUNDLE WORK OUT (ROUNDS rounds, interleaved; VARIANTS)
#   scripts/gpu-decode-step.sh parity  BUNDLE WORK OUT (greedy tokens against mlx-lm)
#
# BUNDLE: from scripts/gpu-build.sh. WHEELS: the `mlx==0.32.2` and
# `mlx-lm==0.32.2` wheels. TOKENIZER: a folder with the default model's
# tokenizer files. Each phase appends to OUT/summary.txt.
set -uo pipefail
phase="$1"; shift
here="$(cd "$(dirname "$0")" && pwd)"

. "$here/gpu-oracle-env.sh"
MODEL_NAME=llama8b-q4-bf16
PROMPT="Explain in detail how a bicycle works, from the pedals and the chain to the gears, the brakes and the frame, and why it stays upright while moving."

case "$phase" in
setup)
  BUNDLE="$1"; WHEELS="$2"; TOKENIZER="$3"; WORK="$4"
  bash "$here/gpu-real-models.sh" oracle "$BUNDLE" "$WHEELS" "$WORK"
  oracle_env
  python3 "$here/oracle/make_random_llama.py" "$WORK/models/$MODEL_NAME" "$TOKENIZER" \
    --dtype bfloat16 --bits 4 --group-size 64
  ;;
kernels)
  BUNDLE="$1"; OUT="$2"; mkdir -p "$OUT"
  RUN="$BUNDLE/run.sh"
  # The kernel against MLX's on every Llama-8B layer shape, 1 row, the
  # built-in launch shapes (narrow layers get fewer columns per warp).
  "$RUN" bench qmv --check --rows 1 --bits 4 --group-size 64 >"$OUT/qmv.log" 2>&1
  note "qmv default: rc=$?"; cat "$OUT/qmv.log" >>"$OUT/summary.txt"
  # Launch shapes on the narrow layers: columns per warp x warps per block.
  for r in 1 2 4; do
    for w in 2 4 8; do
      MLX_BUN_QMV_R=$r MLX_BUN_QMV_WARPS=$w "$RUN" bench qmv --rows 1 --bits 4 --group-size 64 \
        --shapes 1024x4096,4096x4096 >"$OUT/qmv-r$r-w$w.log" 2>&1
      note "qmv R=$r WARPS=$w: rc=$?"; grep -E "x[0-9]" "$OUT/qmv-r$r-w$w.log" >>"$OUT/summary.txt"
    done
  done
  # Half-precision partial sums over one packed word instead of a chunk.
  sed 's/^#define MLX_BUN_QMV_HALF_WORDS 4$/#define MLX_BUN_QMV_HALF_WORDS 1/' \
    "$here/../kernels/cuda/qmv.cu" >"$OUT/qmv-word.cu"
  MLX_BUN_QMV_SOURCE="$OUT/qmv-word.cu" "$RUN" bench qmv --check --rows 1 --bits 4 --group-size 64 \
    >"$OUT/qmv-word.log" 2>&1
  note "qmv, partial sums per word: rc=$?"; cat "$OUT/qmv-word.log" >>"$OUT/summary.txt"
  ;;
attention)
  BUNDLE="$1"; OUT="$2"; mkdir -p "$OUT"
  # The decode attention kernel against MLX's nodes: Llama-8B's heads, one
  # key head per query head at 64 features, one key head for 8 at 256.
  "$BUNDLE/run.sh" bench attention --check --heads 32x8:128,16x16:64,8x1:256 \
    --context 0,17,255,1000,4000 >"$OUT/attention.log" 2>&1
  note "bench attention --check: rc=$?"; cat "$OUT/attention.log" >>"$OUT/summary.txt"
  ;;
decode)
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  RUN="$BUNDLE/run.sh"; M="$WORK/models/$MODEL_NAME"
  # mlx-lm's kernels are compiled once before the rounds (its JIT cache).
  python3 -m mlx_lm generate --model "$M" --prompt "$PROMPT" -m 16 >/dev/null 2>&1
  for round in $(seq 1 "${ROUNDS:-3}"); do
    python3 -m mlx_lm generate --model "$M" --prompt "$PROMPT" -m 256 --temp 0 \
      >"$OUT/mlx-lm-$round.log" 2>&1
    note "round $round mlx-lm: $(grep -E '^(Prompt|Generation):' "$OUT/mlx-lm-$round.log" | tr '\n' ' ')"
    # compile:kernel:graphs[:attention[:norm]] (MLX_BUN_COMPILE_STEP,
    # MLX_BUN_CUDA_KERNEL, MLX_USE_CUDA_GRAPHS, MLX_BUN_CUDA_ATTENTION,
    # MLX_BUN_QMV_NORM; the last two unset when empty or left out).
    for variant in ${VARIANTS:-1:0:1 1:all:1 1:all:1:1 1:all:1::1}; do
      IFS=: read -r compile kernel graphs attention norm <<<"$variant"
      tag="compile$compile-kernel$kernel-graphs$graphs${attention:+-attention$attention}${norm:+-norm$norm}"
      MLX_BUN_COMPILE_STEP=$compile MLX_BUN_CUDA_KERNEL=$kernel MLX_USE_CUDA_GRAPHS=$graphs \
        MLX_BUN_CUDA_ATTENTION=$attention MLX_BUN_QMV_NORM=$norm \
        "$RUN" bench forward -m "$M" --lengths 1 --context 40 --runs 3 --decode 256 --no-db \
        >"$OUT/ours-$tag-$round.log" 2>&1
      note "round $round mlx-bun $tag: rc=$? $(grep -E '^decode' "$OUT/ours-$tag-$round.log" | sed 's/decode 256 tokens, //' | tr '\n' ' ')"
    done
  done
  ;;
parity)
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  M="$WORK/models/$MODEL_NAME"
  # compile:kernel[:attention[:norm]] as for decode.
  for variant in ${PARITY_VARIANTS:-1:0 1:0:1 1:all 1:all:1}; do
    IFS=: read -r compile kernel attention norm <<<"$variant"
    tag="compile$compile-kernel$kernel${attention:+-attention$attention}${norm:+-norm$norm}"
    MLX_BUN_COMPILE_STEP=$compile MLX_BUN_CUDA_KERNEL=$kernel MLX_BUN_CUDA_ATTENTION=$attention \
      MLX_BUN_QMV_NORM=$norm \
      python3 "$here/oracle/gpu_parity.py" --bin "$BUNDLE/run.sh" --model "$M" \
      --max-tokens "${TOKENS:-256}" --out "$OUT/parity-$tag.json" >"$OUT/parity-$tag.log" 2>&1
    note "greedy parity $tag: rc=$? $(tail -1 "$OUT/parity-$tag.log")"
  done
  ;;
*)
  echo "unknown phase $phase" >&2; exit 2 ;;
esac
