#!/usr/bin/env bash
# A bf16 model on an NVIDIA GPU, with a bundle from scripts/gpu-build.sh:
#   scripts/gpu-dtype-check.sh BUNDLE MODEL OUT
# generate once, then serve from a cold and from a warm kernel cache
# (MLX_PTX_CACHE_DIR): time to ready, /health codes seen while starting,
# and log-probability, n > 1 and JSON-mode requests. Summary: OUT/summary.txt.
set -u
B="$1"; M="$2"; OUT="$3"
mkdir -p "$OUT"
export MLX_PTX_CACHE_DIR="$OUT/ptx-cache"
nvidia-smi -L | head -1 > "$OUT/summary.txt"
t0=$(date +%s.%N)
$B/run.sh generate -m $M --prompt "Explain in detail how a bicycle works." -n 48 --json > "$OUT/gen.json" 2> "$OUT/gen.err"
echo "generate rc=$? $(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{print b-a}') s" >> "$OUT/summary.txt"
serve_once() {
  local tag=$1
  local t0=$(date +%s.%N)
  $B/run.sh serve -m $M --port 8090 > "$OUT/serve_$tag.out" 2> "$OUT/serve_$tag.err" &
  local pid=$!
  local codes=""
  for i in $(seq 1 600); do
    c=$(curl -s -o /tmp/h.json -w "%{http_code}" localhost:8090/health)
    codes="$codes $c"
    if [ "$c" = 200 ]; then break; fi
    if ! kill -0 $pid 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "serve $tag ready after $(awk -v a=$t0 -v b=$(date +%s.%N) 'BEGIN{print b-a}') s; health codes: $(echo $codes | tr ' ' '\n' | uniq -c | tr '\n' ' '); last body $(cat /tmp/h.json)" >> "$OUT/summary.txt"
  for body in \
    '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"logprobs":true,"top_logprobs":5}' \
    '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"n":2,"temperature":0.8,"seed":3}' \
    '{"messages":[{"role":"user","content":"A JSON user"}],"max_tokens":40,"response_format":{"type":"json_object"}}'; do
    t1=$(date +%s.%N)
    curl -s localhost:8090/v1/chat/completions -d "$body" >> "$OUT/serve_$tag.answers"; echo >> "$OUT/serve_$tag.answers"
    echo "  request $(awk -v a=$t1 -v b=$(date +%s.%N) 'BEGIN{print b-a}') s" >> "$OUT/summary.txt"
  done
  kill $pid; wait $pid
}
serve_once cold
serve_once warm
cat "$OUT/summary.txt"
