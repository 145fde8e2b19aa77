"""Checks the log-probabilities a `mlx-bun serve` chat answer reported
(greedy, `logprobs` with `top_logprobs`) against mlx-lm's `generate_step`
on the same model and GPU: per step, the chosen token's log-probability and
the top values, within the resolution of the model's dtype.

    python gpu_logprobs.py MODEL_DIR ANSWER.json
"""

import json
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

# A bf16 log-probability near -10 is resolved to 0.06; both sides run the
# same ops, so the difference is far smaller unless the computation differs.
TOL = 2e-2


def main():
    model_dir, answer_file = sys.argv[1:3]
    answer = json.load(open(answer_file))
    steps = answer["choices"][0]["logprobs"]["content"]
    model, tok = load(model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True
    )
    worst, checked = 0.0, 0
    gen = generate_step(mx.array(prompt), model, max_tokens=len(steps), sampler=make_sampler(temp=0.0))
    for step, (token, logprobs) in zip(steps, gen):
        logprobs = logprobs.astype(mx.float32)
        top = sorted(logprobs.tolist(), reverse=True)[: len(step["top_logprobs"])]
        ours_top = [t["logprob"] for t in step["top_logprobs"]]
        worst = max(worst, abs(step["logprob"] - logprobs[int(token)].item()))
        worst = max(worst, *(abs(a - b) for a, b in zip(ours_top, top)))
        checked += 1
    ok = checked == len(steps) and checked > 0 and worst <= TOL
    print(f"  top_logprobs vs mlx-lm: {checked} steps, largest difference {worst:.2e} (ok: {ok})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
