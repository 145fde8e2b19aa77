"""Checks the log-probabilities a `mlx-bun serve` chat answer reported
(greedy, `logprobs` with `top_logprobs`) against mlx-lm's `generate_step`
on the same model and GPU: per step, the chosen token's log-probability and
the top values, each within one bf16 step of mlx-lm's (the serving path
batches rows and may round the last bit differently from `generate_step`).

    python gpu_logprobs.py MODEL_DIR ANSWER.json
"""

import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

import math


def ulp_bf16(x):
    """One bf16 step at x: a bf16 log-probability near -10 is resolved to 0.0625."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def main():
    model_dir, answer_file = sys.argv[1:3]
    answer = json.load(open(answer_file))
    steps = answer["choices"][0]["logprobs"]["content"]
    model, tok = load(model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
    )
    worst, checked, over = 0.0, 0, 0
    gen = generate_step(mx.array(prompt), model, max_tokens=len(steps), sampler=make_sampler(temp=0.0))
    for step, (token, logprobs) in zip(steps, gen):
        logprobs = logprobs.astype(mx.float32)
        top = sorted(logprobs.tolist(), reverse=True)[: len(step["top_logprobs"])]
        ours_top = [t["logprob"] for t in step["top_logprobs"]]
        pairs = [(step["logprob"], logprobs[int(token)].item())] + list(zip(ours_top, top))
        for a, b in pairs:
            worst = max(worst, abs(a - b))
            over += abs(a - b) > ulp_bf16(b)
        checked += 1
    ok = checked == len(steps) and checked > 0 and over == 0
    print(f"  top_logprobs vs mlx-lm: {checked} steps, largest difference {worst:.2e}, "
          f"{over} values more than one bf16 step apart (ok: {ok})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
