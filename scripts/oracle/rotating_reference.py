"""Greedy tokens from mlx-lm with a bounded KV cache built explicitly.

mlx-lm 0.32.2 ignores --max-kv-size for models that build their own cache
(LLaMA among them), so this builds `RotatingKVCache(max_size=N, keep=4)` for
every layer, as `make_prompt_cache(model, N)` does for the others, and runs
`generate_step` greedily. Prints {"token_ids": [...]} as JSON.

Usage: python rotating_reference.py MODEL_DIR PROMPT MAX_KV_SIZE MAX_TOKENS
"""

import json
import sys

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache
from mlx_lm.utils import load


def main():
    model_dir, prompt, max_kv, max_tokens = sys.argv[1:5]
    model, tokenizer = load(model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    cache = [RotatingKVCache(max_size=int(max_kv), keep=4) for _ in model.layers]
    out = []
    for token, _ in generate_step(
        mx.array(ids), model, max_tokens=int(max_tokens), prompt_cache=cache
    ):
        out.append(int(token))
        if token in tokenizer.eos_token_ids:
            break
    print(json.dumps({"prompt_tokens": len(ids), "token_ids": out}))


if __name__ == "__main__":
    main()
