#!/usr/bin/env bash
# Published-model dtypes on an NVIDIA GPU: a bf16 dense and a 4-bit
# (bf16 scales, group 64) Llama-3-8B-shape model, against mlx-lm 0.32.2 on the
# same GPU and MLX. Run in phases (each fits one sitting of a lent machine):
#
#   scripts/gpu-real-models.sh setup  BUNDLE WHEELS TOKENIZER WORK
#   scripts/gpu-real-models.sh parity BUNDLE WORK OUT
#   scripts/gpu-real-models.sh serve  BUNDLE WORK OUT
#   scripts/gpu-real-models.sh bench  BUNDLE WORK OUT
#   scripts/gpu-real-models.sh spec   BUNDLE WORK OUT   (speculative parity only)
#   scripts/gpu-real-models.sh oracle BUNDLE WHEELS WORK  (the oracle alone, no models)
#   scripts/gpu-real-models.sh families BUNDLE WORK OUT  (goldens/arch in bf16 and f16;
#                                                        CASES, DTYPES narrow it)
#   scripts/gpu-real-models.sh batch-bench BUNDLE MODEL OUT  (feature matrix: batch cells)
#
# BUNDLE: from scripts/gpu-build.sh. WHEELS: the `mlx==0.32.2` and
# `mlx-lm==0.32.2` wheels (mlx's CUDA library comes from the bundle).
# TOKENIZER: a folder with the default model's tokenizer files. WORK: where
# the oracle and the models go. Every check compares token ids and fails on
# an empty output; each phase appends to OUT/summary.txt.
set -uo pipefail
phase="$1"; shift
here="$(cd "$(dirname "$0")" && pwd)"

. "$here/gpu-oracle-env.sh"
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
MODELS=(llama8b-bf16 llama8b-q4-bf16)

wait_ready() {  # PORT PID -> prints seconds and the /health codes seen
  local port=$1 pid=$2 t0=$3 codes="" c
  for _ in $(seq 1 1200); do
    c=$(curl -s -o "$OUT/health.json" -w "%{http_code}" "localhost:$port/health")
    codes="$codes $c"
    [ "$c" = 200 ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  echo "ready after $(since "$t0") s (health: $(echo $codes | tr ' ' '\n' | uniq -c | tr -s ' \n' ' '))"
}

install_oracle() {  # BUNDLE WHEELS WORK
  mkdir -p "$3/site"
  python3 -m pip install --quiet --no-deps --target "$3/site" "$2"/*.whl
  mkdir -p "$3/site/mlx/lib" "$3/site/mlx_cuda_13.libs"
  cp "$1/lib/libmlx.so" "$3/site/mlx/lib/"
  cp "$1"/lib/lib{blas,gfortran,lapack,quadmath}* "$3/site/mlx_cuda_13.libs/"
  mkdir -p "$3/site/mlx/include" && cp -r "$1"/include/* "$3/site/mlx/include/"
}

case "$phase" in
oracle)
  BUNDLE="$1"; WHEELS="$2"; WORK="$3"
  install_oracle "$BUNDLE" "$WHEELS" "$WORK"
  WORK="$WORK" oracle_env
  python3 -c 'import mlx.core as mx, mlx_lm; print("oracle:", mx.__version__, mx.default_device())'
  ;;
families)
  # Every tiny checkpoint of goldens/arch/, cast to bf16 and f16: greedy
  # tokens alone and in a four-row batch against mlx-lm on this GPU.
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  cases=${CASES:-$(ls "$here/../goldens/arch")}
  for dtype in ${DTYPES:-bfloat16 float16}; do
    python3 "$here/oracle/gpu_families.py" --bin "$BUNDLE/run.sh" --work "$WORK/families" \
      --dtype $dtype --out "$OUT/families-$dtype.json" $cases >"$OUT/families-$dtype.log" 2>&1
    note "families $dtype: rc=$? $(tail -1 "$OUT/families-$dtype.log")"
    grep -v ": serial EQUAL, batch EQUAL" "$OUT/families-$dtype.log" | head -40 >>"$OUT/summary.txt"
  done
  ;;
batch-bench)
  # Speculation inside the batch on the default model (CELLS, WORKLOADS: other
  # feature-matrix cells and workloads).
  BUNDLE="$1"; MODEL="$2"; OUT="$3"; mkdir -p "$OUT"
  "$BUNDLE/run.sh" bench feature-matrix -m "$MODEL" --cells "${CELLS:-batch4,batch4+spec}" \
    --workloads "${WORKLOADS:-copy}" --rounds 3 --out "$OUT/feature-matrix" --db "$OUT/evals.db" \
    >"$OUT/batch-bench.log" 2>&1
  note "batch-bench: rc=$?"
  tail -40 "$OUT/batch-bench.log" >>"$OUT/summary.txt"
  ;;
setup)
  BUNDLE="$1"; WHEELS="$2"; TOKENIZER="$3"; WORK="$4"; OUT="$WORK"
  mkdir -p "$WORK/site" "$WORK/models"
  install_oracle "$BUNDLE" "$WHEELS" "$WORK"
  oracle_env
  python3 -c 'import mlx.core as mx, mlx_lm; print("oracle:", mx.__version__, mx.default_device())'
  python3 "$here/oracle/make_random_llama.py" "$WORK/models/llama8b-bf16" "$TOKENIZER" --dtype bfloat16 --bits 0
  python3 "$here/oracle/make_random_llama.py" "$WORK/models/llama8b-q4-bf16" "$TOKENIZER" --dtype bfloat16 --bits 4 --group-size 64
  ;;
parity)
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  for m in "${MODELS[@]}"; do
    python3 "$here/oracle/gpu_parity.py" --bin "$BUNDLE/run.sh" --model "$WORK/models/$m" \
      --max-tokens 64 --out "$OUT/parity-$m.json" >"$OUT/parity-$m.log" 2>&1
    note "greedy parity $m: rc=$? $(tail -1 "$OUT/parity-$m.log")"
    # Speculative decoding (n-gram draft) and a JSON-schema answer, token ids.
    p="Explain in detail how a bicycle works."
    "$BUNDLE/run.sh" generate -m "$WORK/models/$m" --prompt "$p" -n 48 --json >"$OUT/plain-$m.json" 2>>"$OUT/gen-$m.log"
    "$BUNDLE/run.sh" generate -m "$WORK/models/$m" --prompt "$p" -n 48 --json --draft-model ngram \
      >"$OUT/spec-$m.json" 2>>"$OUT/gen-$m.log"
    python3 - "$OUT/plain-$m.json" "$OUT/spec-$m.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
a, b = (json.loads(open(f).read().strip().splitlines()[-1])["token_ids"] for f in sys.argv[1:])
print(f"  speculative (ngram) equals plain greedy: {bool(a) and a == b} ({len(a)} tokens)")
PY
    python3 "$here/oracle/gpu_speculative.py" --bin "$BUNDLE/run.sh" --model "$WORK/models/$m" \
      2>"$OUT/spec-parity-$m.log" | tee -a "$OUT/summary.txt"
    schema='{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],"additionalProperties":false}'
    "$BUNDLE/run.sh" generate -m "$WORK/models/$m" --prompt "A person as JSON." -n 96 \
      --json-schema "$schema" --json >"$OUT/schema-$m.json" 2>>"$OUT/gen-$m.log"
    python3 - "$OUT/schema-$m.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
text = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["text"]
try:
    obj = json.loads(text)
    ok = isinstance(obj.get("name"), str) and isinstance(obj.get("age"), int)
except Exception:
    ok = False
print(f"  json-schema answer valid: {ok} {text[:80]!r}")
PY
  done
  ;;
serve)
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  for m in "${MODELS[@]}"; do
    export MLX_PTX_CACHE_DIR="$WORK/ptx-$m"
    rm -rf "$MLX_PTX_CACHE_DIR"
    for start in cold warm; do
      t0=$(date +%s.%N)
      "$BUNDLE/run.sh" serve -m "$WORK/models/$m" --port 8090 >"$OUT/serve-$m-$start.log" 2>&1 &
      pid=$!
      note "serve $m $start: $(wait_ready 8090 $pid "$t0")"
      python3 "$here/gpu_serve_check.py" http://127.0.0.1:8090 >"$OUT/check-$m-$start.json" 2>&1
      note "  requests rc=$? $(head -c 300 "$OUT/check-$m-$start.json")"
      # top_logprobs against mlx-lm's log-softmax of the same greedy prefix.
      curl -s localhost:8090/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":5}' \
        >"$OUT/logprobs-$m-$start.json"
      kill $pid; wait $pid 2>/dev/null
    done
    python3 "$here/oracle/gpu_logprobs.py" "$WORK/models/$m" "$OUT/logprobs-$m-warm.json" | tee -a "$OUT/summary.txt"
  done
  ;;
spec)
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  for m in "${MODELS[@]}"; do
    note "speculative $m:"
    python3 "$here/oracle/gpu_speculative.py" --bin "$BUNDLE/run.sh" --model "$WORK/models/$m" \
      2>"$OUT/spec-parity-$m.log" | tee -a "$OUT/summary.txt"
  done
  ;;
bench)
  BUNDLE="$1"; WORK="$2"; OUT="$3"; mkdir -p "$OUT"; oracle_env
  m=llama8b-q4-bf16
  export MLX_PTX_CACHE_DIR="$WORK/ptx-$m"
  t0=$(date +%s.%N)
  "$BUNDLE/run.sh" serve -m "$WORK/models/$m" --port 8090 >"$OUT/bench-ours.log" 2>&1 &
  ours=$!
  note "bench: ours $(wait_ready 8090 $ours "$t0")"
  t0=$(date +%s.%N)
  python3 -m mlx_lm server --model "$WORK/models/$m" --port 8091 >"$OUT/bench-mlx-lm.log" 2>&1 &
  peer=$!
  for _ in $(seq 1 600); do curl -sf localhost:8091/v1/models >/dev/null 2>&1 && break; sleep 0.25; done
  note "bench: mlx_lm.server listening after $(since "$t0") s"
  for port in 8090 8091; do
    t0=$(date +%s.%N)
    curl -s localhost:$port/v1/chat/completions -d '{"messages":[{"role":"user","content":"Warm up."}],"max_tokens":16}' >/dev/null
    note "bench: first request on :$port took $(since "$t0") s"
  done
  curl -s localhost:8090/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"temperature":0,"logprobs":true,"top_logprobs":5}' \
    >"$OUT/logprobs-$m.json"
  python3 "$here/oracle/gpu_logprobs.py" "$WORK/models/$m" "$OUT/logprobs-$m.json" | tee -a "$OUT/summary.txt"
  for clients in 1 4 8; do
    python3 "$here/bench_serve.py" --server mlx-bun=http://127.0.0.1:8090 --server mlx-lm=http://127.0.0.1:8091 \
      --clients $clients --max-tokens 128 --rounds 3 --json "$OUT/bench-$clients.json" >"$OUT/bench-$clients.md" 2>&1
    note "bench $clients clients: rc=$?"
    cat "$OUT/bench-$clients.md" >>"$OUT/summary.txt"
  done
  kill $ours $peer; wait 2>/dev/null
  ;;
*)
  echo "unknown phase $phase" >&2; exit 2 ;;
esac
