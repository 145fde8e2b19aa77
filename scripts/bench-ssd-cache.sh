#!/usr/bin/env bash
# SSD tier benchmark (`serve --ssd-cache`), in one run:
#   1. TTFT of a ~2,000-token prompt with a full prefill (server without the
#      tier, RAM prompt cache off);
#   2. the same prompt on a server with the tier, which writes it behind;
#      the server is stopped and restarted, and the prompt plus a new
#      question is sent again: TTFT restored from disk;
#   3. decode tok/s of short requests with the tier on vs off.
#
#   scripts/bench-ssd-cache.sh [--model DIR] [--words W] [--decode-tokens T] [--rounds R]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/mlx-bun"
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
MODEL="$CACHE/models/SmolLM2-135M-Instruct"
WORDS=1960 DECODE_TOKENS=32 ROUNDS=3

while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --words) WORDS="$2"; shift 2 ;;
    --decode-tokens) DECODE_TOKENS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done

[ -x "$BIN" ] || { echo "build first: cargo build --release --bin mlx-bun" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "no model at $MODEL (give --model DIR)" >&2; exit 1; }

WORK="$(mktemp -d)"
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# Starts a server with the given flags; sets PID and BASE.
start() {
  "$BIN" serve --port 0 --model "$MODEL" --log-level warn "$@" >"$WORK/out" 2>>"$WORK/err" &
  PID=$!
  for _ in $(seq 600); do
    BASE="$(grep -o 'http://[0-9.:]*' "$WORK/out" 2>/dev/null | head -1 || true)"
    [ -n "$BASE" ] && return 0
    kill -0 "$PID" 2>/dev/null || { cat "$WORK/err" >&2; exit 1; }
    sleep 0.2
  done
  echo "server did not start" >&2; exit 1
}
stop() { kill -TERM "$PID"; wait "$PID" || true; PID=""; }

python3 - "$WORDS" >"$WORK/long.txt" <<'EOF'
import random, sys
random.seed(2)
vocab = "river stone window garden paper silver market engine orange winter \
candle forest bridge letter island thunder violin ladder copper meadow".split()
print(" ".join(random.choice(vocab) for _ in range(int(sys.argv[1]))))
EOF

# req.py BASE CONTENT_FILE SUFFIX MAX_TOKENS: streams a greedy chat request;
# prints "ttft_s decode_tok_s prompt_tokens cached_tokens".
cat >"$WORK/req.py" <<'EOF'
import json, sys, time, urllib.request
base, path, suffix, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
content = open(path).read().strip() + suffix if path != "-" else suffix
body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                             {"content-type": "application/json"})
t0 = time.time(); times = []; usage = {}
with urllib.request.urlopen(req, timeout=900) as r:
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
            times.append(time.time())
ttft = times[0] - t0
tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
print(f"{ttft:.3f} {tps:.2f} {usage.get('prompt_tokens', 0)} {cached}")
EOF
req() { python3 "$WORK/req.py" "$BASE" "$@"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
decode_rounds() {
  for i in $(seq "$ROUNDS"); do
    req - "Write a long story about a fox number $i." "$DECODE_TOKENS" | awk '{print $2}'
  done | median
}

echo "model: $MODEL; prompt: $WORDS words; decode: $DECODE_TOKENS tokens x $ROUNDS rounds"
date -u +"date: %Y-%m-%d %H:%M UTC"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

# Tier off: full prefill, then decode.
start --prompt-cache 0
read -r FULL_TTFT _ FULL_PROMPT FULL_CACHED < <(req "$WORK/long.txt" " Which word comes first?" 4)
OFF_TPS="$(decode_rounds)"
stop

# Tier on: the prompt is written behind, the server restarts, the prompt
# comes back with another question.
SSD="$WORK/ssd"
start --ssd-cache "$SSD"
read -r COLD_TTFT _ _ _ < <(req "$WORK/long.txt" " Which word comes first?" 4)
for _ in $(seq 300); do
  [ "$(curl -s "$BASE/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ssd_cache"]["writes"])')" -ge 1 ] && break
  sleep 0.2
done
stop
ENTRY_BYTES="$(du -cb "$SSD"/*.safetensors | tail -1 | cut -f1)"
start --ssd-cache "$SSD"
read -r WARM_TTFT _ WARM_PROMPT WARM_CACHED < <(req "$WORK/long.txt" " Which word comes last?" 4)
RESTORE_S="$(curl -s "$BASE/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ssd_cache"]["restore_s"]["last"])')"
ON_TPS="$(decode_rounds)"
stop

python3 - "$FULL_TTFT" "$FULL_PROMPT" "$COLD_TTFT" "$WARM_TTFT" "$WARM_PROMPT" "$WARM_CACHED" \
  "$RESTORE_S" "$ENTRY_BYTES" "$OFF_TPS" "$ON_TPS" <<'EOF'
import sys
full, fp, cold, warm, wp, wc, restore, size, off, on = sys.argv[1:]
full, cold, warm, restore, off, on = map(float, (full, cold, warm, restore, off, on))
print(f"| full prefill, tier off | {fp} prompt tokens | TTFT {full:.2f} s |")
print(f"| full prefill, tier on (written behind) | {fp} prompt tokens | TTFT {cold:.2f} s |")
print(f"| after restart, restored from disk | {wp} prompt tokens, {wc} restored | TTFT {warm:.2f} s "
      f"(restore {restore:.3f} s) = {100 * warm / full:.1f}% of full prefill |")
print(f"| entry on disk | {int(size) / 1e6:.1f} MB | |")
print(f"| decode tok/s (median of rounds) | tier off {off:.2f} | tier on {on:.2f} ({100 * (on - off) / off:+.1f}%) |")
EOF
