#!/usr/bin/env python3
"""Greedy decoding with the log-probabilities mlx-lm's server reports: for
each prompt (a chat message), the token ids and, per token, the chosen
token's log-probability and the top N, from generate_step.

Usage: greedy_logprobs.py MODEL_DIR MAX_TOKENS TOP PROMPT [PROMPT ...]
Prints one JSON list, one object per prompt.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
from mlx_lm import load  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402


def main() -> int:
    model_dir, max_tokens, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model, tokenizer = load(model_dir)
    out = []
    for text in sys.argv[4:]:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer.encode(rendered, add_special_tokens=False)
        tokens, logprobs, tops = [], [], []
        for token, lp in generate_step(mx.array(ids), model, max_tokens=max_tokens):
            token = int(token)
            if token in tokenizer.eos_token_ids:
                break
            tokens.append(token)
            logprobs.append(lp[token].item())
            best = mx.argpartition(-lp, kth=top - 1)[:top].tolist()
            tops.append(sorted(([i, lp[i].item()] for i in best), key=lambda e: -e[1]))
        out.append({"prompt": text, "tokens": tokens, "logprobs": logprobs, "top_logprobs": tops})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
