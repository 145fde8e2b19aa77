"""Prompt-cache files of a hybrid model (recurrent states beside attention
layers), written and continued by mlx-lm 0.32.2's own functions.

    write MODEL_DIR FILE PROMPT_IDS SUFFIX_IDS N
        prefill PROMPT_IDS, save the cache with save_prompt_cache, then
        continue greedily from SUFFIX_IDS for N tokens; print them (JSON).
    continue MODEL_DIR FILE SUFFIX_IDS N
        load FILE with load_prompt_cache and continue greedily from
        SUFFIX_IDS for N tokens; print them (JSON).

Ids are comma-separated. Weights are loaded without a tokenizer.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache
from mlx_lm.utils import load_model


def ids(text):
    return [int(t) for t in text.split(",") if t]


def greedy(model, cache, suffix, n):
    out = []
    inputs = mx.array([suffix])
    for _ in range(n):
        logits = model(inputs, cache=cache)
        token = int(mx.argmax(logits[0, -1]).item())
        out.append(token)
        inputs = mx.array([[token]])
    return out


def main():
    mode, model_dir, path = sys.argv[1:4]
    model, _ = load_model(Path(model_dir))
    if mode == "write":
        prompt, suffix, n = ids(sys.argv[4]), ids(sys.argv[5]), int(sys.argv[6])
        cache = make_prompt_cache(model)
        model(mx.array([prompt]), cache=cache)
        mx.eval([c.state for c in cache])
        save_prompt_cache(path, cache, {"model": model_dir})
    elif mode == "continue":
        suffix, n = ids(sys.argv[4]), int(sys.argv[5])
        cache = load_prompt_cache(path)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(greedy(model, cache, suffix, n)))


if __name__ == "__main__":
    main()
