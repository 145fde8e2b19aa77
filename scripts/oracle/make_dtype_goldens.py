#!/usr/bin/env python3
"""Writes goldens/dtypes.json: mlx-lm computing in the dtypes published
models store, for mlx-bun's `--compute-dtype model` to match.

    "$(scripts/oracle/setup.sh)" scripts/oracle/make_dtype_goldens.py \
        --src F32_DIR --models DIR --out goldens/dtypes.json

F32_DIR is the default model dequantized to float32 (`mlx-bun convert --gguf
... -d`). Each variant is made from it with `mlx_lm.convert` as mlx-community
makes its models (`convert_variant`, which the test calls too): bf16 and f16
dense, and 4-bit group-64 with bf16 scales. For each: greedy token ids of
the prompts (mlx-lm's generate_step, stopping at an end token) and the top-5
log-probabilities of the first steps of the first prompt.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
from mlx_lm import load  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from make_goldens import meta, model_fingerprint  # noqa: E402

PROMPTS = [
    "Explain in detail how a bicycle works.",
    "Write a short story about a lighthouse keeper.",
]
LOGPROB_STEPS = 8
TOP = 5

# name -> (mlx_lm.convert flags, prompts used, tokens per prompt). The
# quantized variant computes slowly on a CPU (MLX's quantized matmul with
# bf16 scales: mlx-lm ~0.4 tokens/s here), so it is checked on fewer tokens.
VARIANTS = {
    "bf16": (["--dtype", "bfloat16"], 2, 64),
    "f16": (["--dtype", "float16"], 2, 64),
    "q4-bf16": (["--dtype", "bfloat16", "-q", "--q-bits", "4", "--q-group-size", "64"], 1, 16),
}


def convert_variant(src: Path, dest: Path, flags: list) -> None:
    if (dest / "model.safetensors").is_file():
        return
    subprocess.run(
        [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(src), "--mlx-path", str(dest), *flags],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def greedy(model, tokenizer, text: str, max_tokens: int, with_logprobs: bool) -> dict:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    tokens, tops = [], []
    for token, lp in generate_step(mx.array(ids), model, max_tokens=max_tokens):
        token = int(token)
        if token in tokenizer.eos_token_ids:
            break
        if with_logprobs and len(tokens) < LOGPROB_STEPS:
            top = mx.argpartition(-lp, kth=TOP - 1)[:TOP].tolist()
            tops.append(sorted(([i, lp[i].astype(mx.float32).item()] for i in top), key=lambda e: -e[1]))
        tokens.append(token)
    return {"prompt": text, "prompt_ids": ids, "tokens": tokens, "top_logprobs": tops}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", help="make the variant folders only (the test's set-up)", action="store_true")
    args = parser.parse_args()
    src, models = Path(args.src), Path(args.models)
    doc = {"meta": {**meta(src), "generator": "scripts/oracle/make_dtype_goldens.py"}, "variants": {}}
    for name, (flags, n_prompts, max_tokens) in VARIANTS.items():
        dest = models / name
        convert_variant(src, dest, flags)
        if args.only:
            continue
        model, tokenizer = load(str(dest))
        runs = [greedy(model, tokenizer, p, max_tokens, i == 0) for i, p in enumerate(PROMPTS[:n_prompts])]
        doc["variants"][name] = {
            "flags": flags,
            "max_tokens": max_tokens,
            "model": model_fingerprint(dest),
            "runs": runs,
        }
        print(f"{name}: {[len(r['tokens']) for r in runs]} tokens", file=sys.stderr)
    if not args.only:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
