"""Greedy continuations by mlx-lm (`stream_generate`, as `mlx_lm.generate
--ignore-chat-template --temp 0` runs them), for the tests that compare
mlx-bun's tokens with mlx-lm's on the same model folders.

Usage: python greedy_tokens.py CASES.json
CASES.json is a list of {"model": DIR, "prompt": TEXT, "max_tokens": N}.
Prints one JSON line per case: {"model", "prompt_ids", "tokens", "stopped"}
(tokens without the end-of-sequence token; stopped when one ended the run).
"""

import json
import sys

from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    sampler = make_sampler(temp=0.0)
    for case in cases:
        model, tokenizer = load(case["model"])
        prompt = tokenizer.encode(case["prompt"], add_special_tokens=True)
        tokens = [
            r.token
            for r in stream_generate(
                model,
                tokenizer,
                prompt,
                max_tokens=case["max_tokens"],
                sampler=sampler,
            )
        ]
        # An end-of-sequence token ends the run; mlx_lm.generate prints
        # nothing for it, and mlx-bun leaves it out of its token ids.
        stopped = bool(tokens) and tokens[-1] in tokenizer.eos_token_ids
        if stopped:
            tokens.pop()
        line = {
            "model": case["model"],
            "prompt_ids": prompt,
            "tokens": tokens,
            "stopped": stopped,
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
