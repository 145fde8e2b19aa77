#!/usr/bin/env python3
"""mlx-lm's own `mlx_lm.perplexity.load_data` + `eval_ppl` on local JSONL
files (the oracle for the rows `mlx-bun perplexity` builds from chat,
prompt/completion and text datasets).

`load_data` reads a Hugging Face dataset through the `datasets` library;
here its `load_dataset` is replaced by a loader that reads the JSONL file
into a list of dicts and hands it to mlx-lm's own `create_dataset` (so
the row kind, the tokenization and the dataset classes are mlx-lm's). The
seeding is `mlx_lm.perplexity.main`'s: `np.random.seed(seed)` before
`load_data`. Prints JSON: per file, its rows, perplexity and standard error.

  perplexity_data_reference.py --model M --sequence-length 48 \
      --num-samples 3 --batch-size 3 --seed 123 a.jsonl b.jsonl ...

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx
import numpy as np

import mlx_lm.perplexity as ppl_mod
from mlx_lm.tuner.datasets import create_dataset
from mlx_lm.utils import load


def local_loader(path):
    def load_dataset(args, tokenizer):
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        config = types.SimpleNamespace(**args.hf_dataset, mask_prompt=False)
        return create_dataset(rows, tokenizer, config), [], []

    return load_dataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--sequence-length", type=int, default=512)
    p.add_argument("--num-samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("files", nargs="+")
    a = p.parse_args()

    model, tokenizer = load(a.model)
    out = {}
    for path in a.files:
        ppl_mod.load_dataset = local_loader(path)
        np.random.seed(a.seed)
        mx.random.seed(a.seed)
        data = ppl_mod.load_data(
            tokenizer, path, num_samples=a.num_samples, sequence_length=a.sequence_length
        )
        with contextlib.redirect_stdout(sys.stderr):
            ppl, se = ppl_mod.eval_ppl(model, data, batch_size=a.batch_size)
        out[path] = {"rows": data.tolist(), "perplexity": ppl, "standard_error": se}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
