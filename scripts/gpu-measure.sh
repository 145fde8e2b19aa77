#!/usr/bin/env bash
# Runs the GPU checks and measurements of docs/gpu.md on a machine with an
# NVIDIA GPU, with a bundle made by scripts/gpu-build.sh:
#
#   scripts/gpu-measure.sh BUNDLE MODEL OUT
#
# BUNDLE: the bundle folder; MODEL: a model folder (the default model);
# OUT: where logs and JSON results go. Each step logs to OUT/<step>.log and a
# summary goes to OUT/summary.txt; a failing step is recorded, not fatal.
set -uo pipefail
BUNDLE="$1"; MODEL="$2"; OUT="$3"
RUN="$BUNDLE/run.sh"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
step() {
  local name="$1"; shift
  local t0=$(date +%s.%N)
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc $(elapsed "$t0") s"
  return $rc
}

note "gpu: $(nvidia-smi -L 2>/dev/null | head -1)"

# 1. Kernel correctness and speed against MLX's quantized_matmul, one process.
step qmv4 "$RUN" bench qmv --check --rows 1,2,3,4 --bits 4 --group-size 64
step qmv4-g32 "$RUN" bench qmv --check --rows 1 --bits 4 --group-size 32 --shapes 4096x4096,14336x4096,4096x14336
step qmv8 "$RUN" bench qmv --check --rows 1 --bits 8 --group-size 64
step qmv4-f16 "$RUN" bench qmv --check --rows 1 --dtype float16
step qmv4-glu "$RUN" bench qmv --check --glu --rows 1,2,4 --shapes 14336x4096,8192x2048

# 2. Decode of a random Llama-3-8B-shape model, MLX's kernel vs ours
# (SKIP_8B=1 skips it when scripts/bench_generate.py measures it instead).
[ -n "${SKIP_8B:-}" ] || step decode-8b-q4 "$RUN" bench forward --synthetic llama-8b --q-bits 4 --lengths 1,4 \
  --context 128 --runs 20 --compare-kernel --no-db
[ -n "${SKIP_8B:-}" ] || step decode-8b-bf16 "$RUN" bench forward --synthetic llama-8b --q-bits 0 --lengths 1 \
  --context 128 --runs 20 --no-db

# 3. Greedy tokens on the default model with the kernel on and off.
prompts=("Write a haiku about the sea." "List three prime numbers." "What is the capital of France?" "Explain recursion in one sentence.")
same=0
for i in "${!prompts[@]}"; do
  p="${prompts[$i]}"
  MLX_BUN_CUDA_KERNEL=all "$RUN" generate --model "$MODEL" --prompt "$p" --max-tokens 48 --temp 0 >"$OUT/greedy-on-$i.txt" 2>>"$OUT/greedy.log"
  MLX_BUN_CUDA_KERNEL=0 "$RUN" generate --model "$MODEL" --prompt "$p" --max-tokens 48 --temp 0 >"$OUT/greedy-off-$i.txt" 2>>"$OUT/greedy.log"
  cmp -s "$OUT/greedy-on-$i.txt" "$OUT/greedy-off-$i.txt" && same=$((same + 1))
done
note "greedy kernel on vs off: $same/${#prompts[@]} identical"
"$RUN" generate --model "$MODEL" --prompt "${prompts[0]}" --max-tokens 64 --temp 0 --verbose >"$OUT/generate-verbose.log" 2>&1

# 4. serve with batching: warm-up time, first-request TTFT, sampled and
# concurrent requests.
PORT=8731
t0=$(date +%s.%N)
"$RUN" serve --model "$MODEL" --port $PORT >"$OUT/serve.log" 2>&1 &
spid=$!
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $spid 2>/dev/null || break
  sleep 0.2
done
note "serve ready after $(elapsed "$t0") s"
python3 "$(dirname "$0")/gpu_serve_check.py" "http://127.0.0.1:$PORT" >"$OUT/serve-check.json" 2>"$OUT/serve-check.log"
note "serve check rc=$? $(tail -c 600 "$OUT/serve-check.json")"
kill $spid 2>/dev/null; wait $spid 2>/dev/null

# 5. Training and conversion on the GPU.
data="$(dirname "$0")/../tests/data/sft"
step train-lora "$RUN" train --model "$MODEL" --data "$data" --iters 10 --batch-size 2 \
  --adapter-path "$OUT/adapter"
step train-orpo "$RUN" train --method orpo --model "$MODEL" \
  --data "$(dirname "$0")/../tests/data/orpo" --iters 10 --batch-size 2 --adapter-path "$OUT/orpo"

# 6. Structured output and speculative decoding: the schema is met, and the
# speculative tokens equal the plain greedy tokens.
schema='{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer"}},"required":["name","age"],"additionalProperties":false}'
step json-schema "$RUN" generate --model "$MODEL" --prompt "Invent a person; answer in JSON." \
  --json-schema "$schema" --max-tokens 96 --temp 0
python3 - "$OUT/json-schema.log" <<'PY' | tee -a "$summary"
import json, sys
text = open(sys.argv[1]).read()
start = text.find("{")
try:
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    ok = isinstance(obj.get("name"), str) and isinstance(obj.get("age"), int)
    print(f"json-schema output valid: {ok} {json.dumps(obj)}")
except Exception as e:
    print(f"json-schema output valid: False ({e})")
PY
spec_prompt="Explain recursion in one sentence."
"$RUN" generate --model "$MODEL" --prompt "$spec_prompt" --max-tokens 48 --temp 0 >"$OUT/spec-plain.txt" 2>"$OUT/spec-plain.log"
for draft in "$MODEL" ngram; do
  tag=$(basename "$draft")
  "$RUN" generate --model "$MODEL" --draft-model "$draft" --prompt "$spec_prompt" --max-tokens 48 --temp 0 \
    >"$OUT/spec-$tag.txt" 2>"$OUT/spec-$tag.log"
  if cmp -s "$OUT/spec-plain.txt" "$OUT/spec-$tag.txt"; then
    note "speculative ($tag draft) equals plain greedy: yes"
  else
    note "speculative ($tag draft) equals plain greedy: NO"
  fi
done

step convert-q8 "$RUN" convert --model "$MODEL" -d -o /tmp/mlx-bun-dense
step convert-requant "$RUN" convert --model /tmp/mlx-bun-dense -q --q-bits 4 --q-group-size 64 -o /tmp/mlx-bun-q4
step generate-requant "$RUN" generate --model /tmp/mlx-bun-q4 --prompt "Hi" --max-tokens 16 --temp 0
note "done"
