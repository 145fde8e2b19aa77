#!/usr/bin/env bash
# SSD tier benchmark (`serve --ssd-cache`), in one run, with two servers
# side by side, both with the default RAM prompt cache: OFF (no tier) and
# ON (with the tier):
#   1. TTFT of a ~2,000-token prompt with a full prefill, on both;
#   2. ON is stopped and restarted (RAM empty, the entry on disk), and the
#      prompt comes back with another question: TTFT restored from disk;
#   3. decode tok/s of short prompts, rounds alternating OFF and ON, and
#      the CPU time each server used per generated token.
#
#   scripts/bench-ssd-cache.sh [--model DIR] [--words W] [--decode-tokens T] [--rounds R]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release/mlx-bun"
CACHE="${MLX_BUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mlx-bun}"
MODEL="$CACHE/models/SmolLM2-135M-Instruct"
WORDS=1960 DECODE_TOKENS=64 ROUNDS=5

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
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# start NAME FLAGS...: starts a server; sets PID_NAME and BASE_NAME.
start() {
  local name="$1"; shift
  "$BIN" serve --port 0 --model "$MODEL" --log-level warn "$@" \
    >"$WORK/$name.out" 2>>"$WORK/$name.err" &
  local pid=$! base=""
  PIDS+=("$pid")
  for _ in $(seq 600); do
    base="$(grep -o 'http://[0-9.:]*' "$WORK/$name.out" 2>/dev/null | head -1 || true)"
    [ -n "$base" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$WORK/$name.err" >&2; exit 1; }
    sleep 0.2
  done
  [ -n "$base" ] || { echo "server $name did not start" >&2; exit 1; }
  printf -v "PID_$name" '%s' "$pid"
  printf -v "BASE_$name" '%s' "$base"
}
stop() { local pid="PID_$1"; kill -TERM "${!pid}"; wait "${!pid}" || true; }

python3 - "$WORDS" >"$WORK/long.txt" <<'PY'
import random, sys
random.seed(2)
vocab = "river stone window garden paper silver market engine orange winter \
candle forest bridge letter island thunder violin ladder copper meadow".split()
print(" ".join(random.choice(vocab) for _ in range(int(sys.argv[1]))))
PY

# req.py BASE CONTENT_FILE|- SUFFIX MAX_TOKENS: streams a greedy chat
# request; prints "ttft_s decode_tok_s prompt_tokens cached_tokens".
cat >"$WORK/req.py" <<'PY'
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
        if "error" in ev:
            sys.exit(f"request failed: {ev}")
        if ev.get("usage"):
            usage = ev["usage"]
        choice = (ev.get("choices") or [{}])[0]
        # A token whose text is held back still ends the prefill: count
        # the first content or the end, whichever comes first.
        if choice.get("delta", {}).get("content") or (choice.get("finish_reason") and not times):
            times.append(time.time())
if not times:
    sys.exit(f"no tokens; usage {usage}")
ttft = times[0] - t0
tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
print(f"{ttft:.3f} {tps:.2f} {usage.get('prompt_tokens', 0)} {cached} {usage.get('completion_tokens', 0)}")
PY
req() { python3 "$WORK/req.py" "$@"; }
# CPU seconds (user + system, all threads) a process has used so far.
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
ssd_stat() { curl -s "$1/stats" | python3 -c "import json,sys; print(json.load(sys.stdin)['ssd_cache']$2)"; }

echo "model: $MODEL; prompt: $WORDS words; decode: $DECODE_TOKENS tokens x $ROUNDS rounds"
date -u +"date: %Y-%m-%d %H:%M UTC"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"

SSD="$WORK/ssd"
start OFF
start ON --ssd-cache "$SSD"
read -r FULL_TTFT _ FULL_PROMPT _ _ < <(req "$BASE_OFF" "$WORK/long.txt" " Which word comes first?" 4)
read -r COLD_TTFT _ _ _ _ < <(req "$BASE_ON" "$WORK/long.txt" " Which word comes first?" 4)
for _ in $(seq 300); do
  [ "$(ssd_stat "$BASE_ON" '["writes"]')" -ge 1 ] && break
  sleep 0.2
done
stop ON
ENTRY_BYTES="$(du -cb "$SSD"/*.safetensors | tail -1 | cut -f1)"
start ON --ssd-cache "$SSD"
read -r WARM_TTFT _ WARM_PROMPT WARM_CACHED _ < <(req "$BASE_ON" "$WORK/long.txt" " Which word comes last?" 4)
RESTORE_S="$(ssd_stat "$BASE_ON" '["restore_s"]["last"]')"

# Wall-clock tok/s swings with other load on a shared machine; the CPU
# time each server spends per generated token (its writer thread included)
# does much less.
: >"$WORK/off.tps"; : >"$WORK/on.tps"; : >"$WORK/off.tok"; : >"$WORK/on.tok"
CPU0_OFF="$(cpu_s "$PID_OFF")"; CPU0_ON="$(cpu_s "$PID_ON")"
for i in $(seq "$ROUNDS"); do
  for side in OFF ON; do
    base="BASE_$side"; lower="$(echo "$side" | tr A-Z a-z)"
    req "${!base}" - "Write a long story about a fox number $i." "$DECODE_TOKENS" >"$WORK/r"
    awk '{print $2}' "$WORK/r" >>"$WORK/$lower.tps"
    awk '{print $5}' "$WORK/r" >>"$WORK/$lower.tok"
  done
done
sleep 1 # let the last write finish
CPU_OFF="$(awk -v a="$CPU0_OFF" -v b="$(cpu_s "$PID_OFF")" 'BEGIN {print b - a}')"
CPU_ON="$(awk -v a="$CPU0_ON" -v b="$(cpu_s "$PID_ON")" 'BEGIN {print b - a}')"
TOK_OFF="$(awk '{s += $1} END {print s}' "$WORK/off.tok")"
TOK_ON="$(awk '{s += $1} END {print s}' "$WORK/on.tok")"
WRITES="$(ssd_stat "$BASE_ON" '["writes"]')"
stop ON
stop OFF

python3 - "$FULL_TTFT" "$FULL_PROMPT" "$COLD_TTFT" "$WARM_TTFT" "$WARM_PROMPT" "$WARM_CACHED" \
  "$RESTORE_S" "$ENTRY_BYTES" "$WRITES" "$WORK/off.tps" "$WORK/on.tps" \
  "$CPU_OFF" "$TOK_OFF" "$CPU_ON" "$TOK_ON" <<'PY'
import statistics, sys
(full, fp, cold, warm, wp, wc, restore, size, writes, off_path, on_path,
 cpu_off, tok_off, cpu_on, tok_on) = sys.argv[1:]
ms_off = 1000 * float(cpu_off) / float(tok_off)
ms_on = 1000 * float(cpu_on) / float(tok_on)
full, cold, warm, restore = map(float, (full, cold, warm, restore))
offs = [float(x) for x in open(off_path).read().split()]
ons = [float(x) for x in open(on_path).read().split()]
off, on = statistics.median(offs), statistics.median(ons)
print(f"| full prefill, tier off | {fp} prompt tokens | TTFT {full:.2f} s |")
print(f"| full prefill, tier on (written behind) | {fp} prompt tokens | TTFT {cold:.2f} s |")
print(f"| after restart, restored from disk | {wp} prompt tokens, {wc} restored | TTFT {warm:.2f} s "
      f"(restore {restore:.3f} s) = {100 * warm / full:.1f}% of the full prefill |")
print(f"| entry on disk | {int(size) / 1e6:.1f} MB | |")
print(f"| decode tok/s, median of {len(offs)} interleaved rounds | tier off {off:.2f} | "
      f"tier on {on:.2f} ({100 * (on - off) / off:+.1f}%; {writes} entries written meanwhile) |")
print(f"| CPU time per generated token | tier off {ms_off:.1f} ms ({tok_off} tokens) | "
      f"tier on {ms_on:.1f} ms ({tok_on} tokens; {100 * (ms_on - ms_off) / ms_off:+.1f}%) |")
print(f"rounds off: {offs}")
print(f"rounds on:  {ons}")
PY
