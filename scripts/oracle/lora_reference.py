#!/usr/bin/env python3
"""LoRA reference runs with mlx-lm (the oracle for `mlx-bun train`).

Two modes, both printing one JSON object on stdout:

  train:  trains with mlx-lm's own trainer from the adapter file --init
          (written first, random and seeded, if it does not exist) and
          reports the loss of every step; with --eval-adapters, then
          evaluates those adapter directories (as in the eval mode) on the
          training rows, its own result included as --adapter-path.
          lora_reference.py train --model M --data D --init INIT.safetensors \
              --adapter-path OUT --iters 3 --batch-size 2 --num-layers 2 \
              --learning-rate 1e-4 [--eval-adapters DIR ...]
  eval:   loads each adapter directory with mlx-lm and reports the mean
          cross-entropy (mlx-lm's default_loss) of a JSONL file's rows.
          lora_reference.py eval --model M --data-file F --adapters A1 A2

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import json
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlx_lm import lora as lora_cli
from mlx_lm.tuner.datasets import CacheDataset, create_dataset, load_dataset
from mlx_lm.tuner.trainer import TrainingCallback, default_loss, iterate_batches
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters
from mlx_lm.utils import load


class Recorder(TrainingCallback):
    def __init__(self):
        self.losses = []
        self.tokens_per_sec = []
        self.peak_memory = []

    def on_train_loss_report(self, info):
        self.losses.append(info["train_loss"])
        self.tokens_per_sec.append(info["tokens_per_second"])
        self.peak_memory.append(info["peak_memory"])


def write_random_init(model, args, path):
    """A random adapter for the layout mlx-lm would build (both factors non-zero)."""
    linear_to_lora_layers(
        model,
        args.num_layers,
        {"rank": args.rank, "scale": args.scale, "dropout": 0.0},
    )
    rng = np.random.default_rng(args.seed)
    tensors = {}
    for name, p in tree_flatten(model.trainable_parameters()):
        if name.endswith("lora_a") or name.endswith("lora_b"):
            tensors[name] = mx.array(
                rng.uniform(-0.05, 0.05, size=p.shape).astype(np.float32)
            )
    mx.save_safetensors(str(path), tensors)


def train(args):
    model, tokenizer = load(args.model)
    init = Path(args.init)
    if not init.exists():
        write_random_init(model, args, init)
        model, tokenizer = load(args.model)
    cfg = dict(lora_cli.CONFIG_DEFAULTS)
    cfg.update(
        model=args.model,
        train=True,
        data=args.data,
        seed=args.seed,
        num_layers=args.num_layers,
        batch_size=args.batch_size,
        iters=args.iters,
        val_batches=1,
        learning_rate=args.learning_rate,
        steps_per_report=1,
        steps_per_eval=10**9,
        resume_adapter_file=str(init),
        adapter_path=args.adapter_path,
        save_every=10**9,
        mask_prompt=args.mask_prompt,
        optimizer=args.optimizer,
        lora_parameters={"rank": args.rank, "dropout": 0.0, "scale": args.scale},
    )
    ns = types.SimpleNamespace(**cfg)
    np.random.seed(args.seed)
    train_set, valid_set, _ = load_dataset(ns, tokenizer)
    rec = Recorder()
    lora_cli.train_model(ns, model, train_set, valid_set, rec)
    evals = {}
    if args.eval_adapters:
        dirs = [args.adapter_path] + list(args.eval_adapters)
        evals = evaluate_adapters(args.model, str(Path(args.data) / "train.jsonl"), dirs)
    emit(
        {
            "eval": evals,
            "losses": rec.losses,
            "tokens_per_sec": rec.tokens_per_sec,
            "peak_memory_gb": rec.peak_memory,
            "init": str(init),
            "adapter_path": args.adapter_path,
        }
    )


def evaluate_adapters(model_path, data_file, adapters):
    rows = [json.loads(l) for l in open(data_file) if l.strip()]
    out = {}
    for adapter in adapters:
        model, tokenizer = load(model_path)
        load_adapters(model, adapter)
        model.eval()
        ds = CacheDataset(create_dataset(rows, tokenizer, types.SimpleNamespace()))
        total, ntoks = 0.0, 0
        for batch in iterate_batches(ds, 1, 2048):
            loss, toks = default_loss(model, *batch)
            total += loss.item() * toks.item()
            ntoks += toks.item()
        out[adapter] = total / ntoks
    return out


def evaluate(args):
    emit({"eval": evaluate_adapters(args.model, args.data_file, args.adapters)})


def emit(obj):
    """The result goes to the real stdout; mlx-lm's own printing is sent to stderr."""
    sys.__stdout__.write(json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--init", required=True)
    t.add_argument("--adapter-path", required=True)
    t.add_argument("--iters", type=int, default=3)
    t.add_argument("--batch-size", type=int, default=2)
    t.add_argument("--num-layers", type=int, default=2)
    t.add_argument("--learning-rate", type=float, default=1e-4)
    t.add_argument("--rank", type=int, default=8)
    t.add_argument("--scale", type=float, default=20.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--optimizer", default="adam")
    t.add_argument("--mask-prompt", action="store_true")
    t.add_argument("--eval-adapters", nargs="*", default=[])
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--data-file", required=True)
    e.add_argument("--adapters", nargs="+", required=True)
    args = p.parse_args()
    with contextlib.redirect_stdout(sys.stderr):
        if args.mode == "train":
            train(args)
        else:
            evaluate(args)


if __name__ == "__main__":
    sys.exit(main())
