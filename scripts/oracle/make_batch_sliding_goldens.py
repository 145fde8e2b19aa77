#!/usr/bin/env python3
"""Goldens for continuous batching of sliding-window models, from mlx-lm's
own `BatchGenerator` (whose windowed layers hold `BatchRotatingKVCache`).

Runs the tiny random checkpoints of goldens/arch/ (made by
make_arch_goldens.py) on token-id prompts longer than their window, for
more new tokens than the window holds, and records every row's greedy
tokens in the scenarios of make_batch_goldens.py:

  b2     two prompts inserted together
  b4     four prompts of uneven lengths inserted together
  join   two prompts; after --join-after steps two more are inserted while
         the first two decode

It also records each prompt's serial greedy tokens (`generate_step`) and
the batch cache class of every layer, so a reader sees that batch and serial
agree in mlx-lm too and which layers rotate. (Gemma 2 has no windowed
layers in mlx-lm 0.32.2, and its batched attention fails there on rows of
uneven lengths, so it is not among them.)

    python scripts/oracle/make_batch_sliding_goldens.py \
        --model gemma3_text=goldens/arch/gemma3_text \
        --model gpt_oss=goldens/arch/gpt_oss \
        --model gemma4_text=goldens/arch/gemma4_text \
        --out goldens/batch_sliding.json
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.generate import BatchGenerator, generate_step  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

from make_batch_goldens import SCENARIOS, fingerprint, run  # noqa: E402

# Lengths 9, 14, 7 and 20: every prompt is longer than a window of 5.
PROMPTS = [
    [1, 17, 42, 99, 3, 250, 7, 7, 128],
    [64, 5, 200, 9, 11, 31, 4, 77, 160, 2, 90, 13, 54, 201],
    [8, 16, 32, 64, 128, 255, 1],
    [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100],
]


def serial(model, prompt, max_tokens):
    steps = generate_step(mx.array(prompt), model, max_tokens=max_tokens)
    return [int(t) for t, _ in steps]


def batch_cache_kinds(model, prompt):
    """The cache class of every layer of a one-row BatchGenerator batch."""
    gen = BatchGenerator(model, max_tokens=2, stop_tokens=[])
    gen.insert([prompt], [2])
    kinds = None
    while True:
        responses = gen.next_generated()
        batch = gen._generation_batch
        if batch is not None and len(batch) and kinds is None:
            kinds = [type(c).__name__ for c in batch.prompt_cache]
        if not responses and kinds is not None:
            break
    gen.close()
    return kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--join-after", type=int, default=6)
    a = ap.parse_args()

    models = {}
    for spec in a.model:
        name, path = spec.split("=", 1)
        path = os.path.expanduser(path)
        model, _ = load_model(Path(path))
        config = json.loads((Path(path) / "config.json").read_text())
        scenarios = {}
        for sname, s in SCENARIOS.items():
            out, joined = run(
                model, None, PROMPTS, s["first"], s["later"], a.max_tokens, a.join_after, []
            )
            scenarios[sname] = {
                "first": s["first"],
                "later": s["later"],
                "join_after_steps": a.join_after if s["later"] else None,
                "rows_decoding_at_join": joined,
                "tokens": {str(i): out[i] for i in sorted(out)},
            }
        models[name] = {
            "fingerprint": fingerprint(path),
            "sliding_window": config.get("sliding_window"),
            "batch_caches": batch_cache_kinds(model, PROMPTS[0]),
            "serial_tokens": [serial(model, p, a.max_tokens) for p in PROMPTS],
            "scenarios": scenarios,
        }
    doc = {
        "meta": {
            "command": "python " + " ".join(sys.argv),
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "max_tokens": a.max_tokens,
            "prompt_ids": PROMPTS,
        },
        "models": models,
    }
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
