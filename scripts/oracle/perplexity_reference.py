#!/usr/bin/env python3
"""Perplexity reference with mlx-lm (the oracle for `mlx-bun perplexity`).

Builds token rows from one plain-text file the way `mlx_lm.perplexity`
builds them from a dataset (mlx-lm's `TextDataset.process`: encode, append
EOS; concatenate; cut into rows of --sequence-length), then scores them with
mlx-lm's own `eval_ppl`. Prints one JSON object: the rows, the perplexity and
its standard error.

  perplexity_reference.py --model M --data-file F --sequence-length 32 \
      --num-samples 4 --batch-size 2

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx

from mlx_lm.perplexity import eval_ppl
from mlx_lm.tuner.datasets import TextDataset
from mlx_lm.utils import load


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data-file", required=True)
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--num-samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args()

    model, tokenizer = load(a.model)
    with open(a.data_file, encoding="utf-8") as f:
        text = f.read()
    dataset = TextDataset([{"text": text}], tokenizer)
    tokens, _ = dataset.process(dataset[0])
    n = a.num_samples
    if n > 0:
        tokens = tokens[: n * a.sequence_length]
    usable = (len(tokens) // a.sequence_length) * a.sequence_length
    data = mx.array(tokens[:usable]).reshape(-1, a.sequence_length)
    # eval_ppl draws a progress line on stdout; keep stdout for the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        ppl, se = eval_ppl(model, data, batch_size=a.batch_size)
    print(
        json.dumps(
            {
                "rows": data.tolist(),
                "perplexity": ppl,
                "standard_error": se,
            }
        )
    )


if __name__ == "__main__":
    main()
