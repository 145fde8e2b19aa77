#!/usr/bin/env python3
"""DWQ reference with mlx-lm (the oracle for `mlx-bun train --method dwq`).

Runs mlx-lm's own `dwq_quantize` on the teacher quantized by mlx-lm's
`quantize_model`, reading the teacher targets from --target-dir in the
layout `mlx_lm.dwq --target-dir` uses (`{train,valid}/<batch>.safetensors`
with `logits` and `indices`). The rows come from --rows (a JSON list of
token lists) and form a single batch for both splits, so the batch order
cannot differ. The losses mlx-lm computes are captured where it reduces
them (`mx.distributed.all_sum`, called on every loss and token count) and
printed as one JSON object:

  {"initial_valid_loss": .., "step_losses": [..], "final_valid_loss": ..}

  dwq_reference.py --model TEACHER --rows rows.json --target-dir T \
      --bits 4 --group-size 64 --learning-rate 1e-4 --temperature 2

The student is kept in float32 (`dtype=mx.float32`), as mlx-bun computes
on the CPU; mlx-lm's command line casts to bfloat16.

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import copy
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx
import mlx.optimizers as optimizers

from mlx_lm.quant import dwq
from mlx_lm.utils import load, quantize_model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--target-dir", required=True)
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=123)
    a = p.parse_args()

    with open(a.rows) as f:
        rows = json.load(f)
    data = [(r, 0) for r in rows]
    longest = max(len(r) for r in rows)
    target_dir = Path(a.target_dir)

    def target_fn(_, idx, split):
        t = mx.load(str(target_dir / split / f"{idx:010d}.safetensors"))
        return t["logits"], t["indices"]

    model, _, config = load(a.model, return_config=True)
    q_model = copy.deepcopy(model)
    quantize_model(q_model, config, group_size=a.group_size, bits=a.bits)
    del model

    recorded = []
    all_sum = mx.distributed.all_sum

    def recording_all_sum(x, *args, **kwargs):
        out = all_sum(x, *args, **kwargs)
        recorded.append(out.item())
        return out

    mx.distributed.all_sum = recording_all_sum
    opt = optimizers.Adam(learning_rate=a.learning_rate, bias_correction=True)
    with contextlib.redirect_stdout(sys.stderr):
        dwq.dwq_quantize(
            q_model,
            target_fn,
            opt,
            data,
            data,
            batch_size=len(rows),
            max_seq_length=longest,
            seed=a.seed,
            dtype=mx.float32,
            temperature=a.temperature,
        )
    mx.distributed.all_sum = all_sum
    # (loss, tokens) pairs: initial validation, each step, final validation.
    losses = recorded[0::2]
    tokens = recorded[1::2]
    print(
        json.dumps(
            {
                "initial_valid_loss": losses[0],
                "step_losses": losses[1:-1],
                "final_valid_loss": losses[-1],
                "tokens": tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
