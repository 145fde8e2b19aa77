#!/usr/bin/env bash
# Training speed on this machine: tokens/s and peak memory per step of
# `mlx-bun train` against mlx-lm's trainer on the same data and settings,
# and the cost of an ORPO step against an SFT step on the same sequences.
#
#   scripts/bench-train.sh [ITERS] [NUM_LAYERS]
#
# Prints a markdown table (the `## train` section of docs/BENCHMARKS.md).
# Needs the oracle environment (mlx-lm) for the comparison column.
set -euo pipefail
cd "$(dirname "$0")/.."
iters="${1:-6}"
layers="${2:-8}"
cargo build --release --quiet
bin=./target/release/mlx-bun
cache="${MLX_BUN_CACHE:-$HOME/.cache/mlx-bun}"
py="${MLX_BUN_ORACLE_PYTHON:-$cache/oracle-venv/bin/python}"
model="$cache/models/SmolLM2-135M-Instruct"
[[ -f "$model/config.json" ]] || $bin generate --prompt hi -n 1 >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# SFT data without a validation split (validation is not what is measured).
mkdir -p "$work/sft" "$work/orpo" "$work/chosen"
cp tests/data/sft/train.jsonl "$work/sft/train.jsonl"
cp tests/data/orpo/train.jsonl "$work/orpo/train.jsonl"
# The ORPO pairs' prompt + chosen as SFT rows: the SFT side of the comparison.
python3 - "$work/orpo/train.jsonl" > "$work/chosen/train.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    print(json.dumps({"messages": row["prompt"] + [{"role": "assistant", "content": row["chosen"]}]}))
EOF

run_ours() { # data method batch -> JSON lines
  $bin train --model "$model" --data "$1" --method "$2" --batch-size "$3" --iters "$iters" \
    --num-layers "$layers" --learning-rate 1e-5 --adapter-path "$work/ad-$2" --json --no-db \
    | grep '"event":"step"'
}

run_ours "$work/sft" sft 4 > "$work/ours-sft.jsonl"
run_ours "$work/chosen" sft 1 > "$work/ours-chosen.jsonl"
run_ours "$work/orpo" orpo 1 > "$work/ours-orpo.jsonl"
if [[ -x "$py" ]]; then
  HF_HUB_OFFLINE=1 "$py" scripts/oracle/lora_reference.py train --model "$model" \
    --data "$work/sft" --init "$work/init.safetensors" --adapter-path "$work/ad-mlx" \
    --iters "$iters" --batch-size 4 --num-layers "$layers" --learning-rate 1e-5 \
    2>/dev/null > "$work/mlx-sft.json"
else
  echo '{}' > "$work/mlx-sft.json"
fi

python3 - "$work" "$iters" "$layers" <<'EOF'
import json, statistics, sys
work, iters, layers = sys.argv[1], sys.argv[2], sys.argv[3]
def steps(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl") if l.strip()]
def med(xs):
    xs = list(xs)[1:] or list(xs)  # the first step includes warm-up
    return statistics.median(xs)
sft, chosen, orpo = steps("ours-sft"), steps("ours-chosen"), steps("ours-orpo")
mlx = json.load(open(f"{work}/mlx-sft.json"))
gb = lambda b: b / 1e9
print(f"SmolLM2-135M-Instruct (4-bit), CPU, LoRA rank 8 on the last {layers} blocks (every linear layer), "
      f"{iters} steps, median of steps 2..{iters}.\n")
print("| trainer | batch | tokens/s | peak memory |")
print("|---|---|---|---|")
print(f"| mlx-bun SFT | 4 | {med(s['tokens_per_sec'] for s in sft):.1f} | "
      f"{gb(max(s['peak_memory_bytes'] for s in sft)):.2f} GB |")
if mlx.get("tokens_per_sec"):
    print(f"| mlx-lm 0.32.2 `lora` | 4 | {med(mlx['tokens_per_sec']):.1f} | "
          f"{max(mlx['peak_memory_gb']):.2f} GB |")
print()
sft_s = med(s["step_seconds"] for s in chosen)
orpo_s = med(s["step_seconds"] for s in orpo)
print("| step (batch 1, same pairs) | seconds/step | tokens/step | peak memory |")
print("|---|---|---|---|")
print(f"| SFT on prompt + chosen | {sft_s:.2f} | {med(s['tokens'] for s in chosen):.0f} | "
      f"{gb(max(s['peak_memory_bytes'] for s in chosen)):.2f} GB |")
print(f"| ORPO on prompt + chosen + rejected | {orpo_s:.2f} | {med(s['tokens'] for s in orpo):.0f} | "
      f"{gb(max(s['peak_memory_bytes'] for s in orpo)):.2f} GB |")
print(f"\nORPO step / SFT step: {orpo_s / sft_s:.2f}x (two full sequences would be about 2x).")
EOF
