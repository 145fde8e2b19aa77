"""Loads a converted model directory in mlx-lm and greedy-generates, so the
test suite can check that mlx-lm accepts what `mlx-bun convert` writes and
produces the same tokens.

Usage: check_convert.py DIR [--prompt TEXT] [--max-tokens N] [--encode TEXT ...]

Prints one JSON object: the prompt ids (chat template applied), the generated
ids and text, the model's quantization entry, and for each --encode string the
ids of both the `tokenizers` library and transformers' AutoTokenizer.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--encode", action="append", default=[])
    args = parser.parse_args()

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    model, tokenizer = load(args.model)
    messages = [{"role": "user", "content": args.prompt}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    if isinstance(prompt_ids, dict):
        prompt_ids = prompt_ids["input_ids"]
    prompt_ids = list(prompt_ids)

    generated = []
    for token, _ in generate_step(
        mx.array(prompt_ids), model, max_tokens=args.max_tokens
    ):
        token = int(token)
        if token in tokenizer.eos_token_ids:
            break
        generated.append(token)

    fast = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(args.model)
    encodings = [
        {
            "text": text,
            "tokenizers": fast.encode(text, add_special_tokens=False).ids,
            "transformers": auto.encode(text, add_special_tokens=False),
        }
        for text in args.encode
    ]

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    json.dump(
        {
            "prompt_ids": prompt_ids,
            "token_ids": generated,
            "text": tokenizer.decode(generated),
            "quantization": config.get("quantization"),
            "encodings": encodings,
        },
        sys.stdout,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
