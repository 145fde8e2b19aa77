#!/usr/bin/env bash
# Two builds of mlx-bun alternating on one 4-row batch file (the feature
# matrix's copy prompts, 300 tokens each, end of text suppressed), then one
# row of `bench generate`; each round prints both builds' numbers and
# whether their tokens agree.
#   scripts/bench-batch-ab.sh BEFORE_BIN AFTER_BIN [rounds] [extra generate flags…]
set -euo pipefail
before=${1:?the binary before}
after=${2:?the binary after}
rounds=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir/copy.jsonl" <<'PY'
import json, sys
texts = [
    "The old lighthouse stood at the edge of the cliff. Every night its keeper climbed the "
    "spiral stairs, lit the lamp, and watched the ships pass far below. In winter the storms "
    "shook the windows, but the light never went out.",
    "Our team meets every Monday at nine. We review last week's tickets, agree on the "
    "priorities for the coming week, and assign each ticket to one person. The meeting ends "
    "at ten, and the notes go to the shared folder.",
]
with open(sys.argv[1], "w") as f:
    for i in range(4):
        prompt = ("Repeat the following text exactly, word for word, but write every number "
                  "as digits:\n\n" + texts[i % 2] + " " + texts[(i + 1) % 2] * 3)
        f.write(json.dumps({"prompt": prompt, "max_tokens": 300}) + "\n")
PY
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    bin=$before
    [[ $side == after ]] && bin=$after
    start=$(date +%s.%N)
    "$bin" generate --batch-file "$dir/copy.jsonl" --decode-concurrency 4 \
      --logit-bias '{"0":-100,"2":-100}' --json "$@" > "$dir/$side.jsonl"
    end=$(date +%s.%N)
    one=$("$bin" bench generate -p 128 -g 128 -n 2 --no-db 2>&1 |
      sed -n 's/.*Averages:.*generation_tps=\([0-9.]*\).*/\1/p')
    python3 - "$dir/$side.jsonl" "$side" "$r" "$start" "$end" "$one" <<'PY'
import json, sys
path, side, r, start, end, one = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
tokens = sum(x["generation_tokens"] for x in rows)
print(f"round {r} {side:6} rows' tok/s summed {sum(x['generation_tps'] for x in rows):7.1f}"
      f"  tokens per wall s {tokens / (float(end) - float(start)):6.1f}"
      f"  one row tok/s {one}")
PY
  done
  if cmp -s <(python3 -c "import json,sys;[print(json.loads(l)['token_ids']) for l in open(sys.argv[1])]" "$dir/before.jsonl") \
            <(python3 -c "import json,sys;[print(json.loads(l)['token_ids']) for l in open(sys.argv[1])]" "$dir/after.jsonl"); then
    echo "round $r tokens: equal"
  else
    echo "round $r tokens: DIFFER"
  fi
done
