#!/usr/bin/env python3
"""LoRA on the fused (Phi-3) and Mixture-of-Experts families with mlx-lm, the
oracle for `tests/lora_families.rs`. Each mode prints one JSON object.

  init:   builds mlx-lm's own LoRA layers on the model (`linear_to_lora_layers`
          with its default keys) and writes an adapter directory with random
          arrays (both factors non-zero) and mlx-lm's adapter_config.json; reports
          every adapter tensor's name and shape.
          lora_families.py init --model M --adapter-path A --num-layers 2 --rank 4 --scale 2
  check:  for each adapter directory, loads it as `mlx_lm.generate --adapter-path`
          does (`load(model, adapter_path=...)`, strict about names and shapes),
          and reports the mean next-token cross-entropy of --tokens, the gradients
          of that loss with respect to every adapter array (saved to
          <adapter>/grads.safetensors) and the greedy continuation of --prompt;
          with --fuse-to, then runs `mlx_lm.fuse` on the last adapter.
  fuse:   only runs `mlx_lm.fuse` (for quantized MoE models, which mlx-lm
          cannot run on MLX's CPU build but can fuse).
          lora_families.py fuse --model M --adapter-path A --save-path OUT
          lora_families.py check --model M --adapters A1 A2 --tokens 1,17,... \
              --prompt 1,17,42 --max-tokens 8 [--fuse-to OUT]

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from mlx_lm import fuse as fuse_cli
from mlx_lm.generate import generate_step
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load


def adapter_leaves(model):
    return {
        k: v
        for k, v in tree_flatten(model.parameters())
        if k.endswith(".lora_a") or k.endswith(".lora_b")
    }


def init(args):
    model, _ = load(args.model)
    model.freeze()
    lora = {"rank": args.rank, "scale": args.scale, "dropout": 0.0}
    linear_to_lora_layers(model, args.num_layers, lora)
    rng = np.random.default_rng(args.seed)
    tensors = {
        k: mx.array(rng.uniform(-0.05, 0.05, size=v.shape).astype(np.float32))
        for k, v in adapter_leaves(model).items()
    }
    out = Path(args.adapter_path)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), tensors)
    config = {"fine_tune_type": "lora", "num_layers": args.num_layers, "lora_parameters": lora}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=4))
    return {"shapes": {k: list(v.shape) for k, v in tensors.items()}}


def mean_ce(model, ids):
    logits = model(ids[:, :-1]).astype(mx.float32)
    targets = ids[:, 1:]
    lse = mx.logsumexp(logits, axis=-1)
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return (lse - picked).mean()


def check_one(model_path, adapter, tokens, prompt, max_tokens):
    model, _ = load(model_path, adapter_path=adapter)
    ids = mx.array(tokens)[None]
    params = adapter_leaves(model)

    def loss_fn(p):
        model.update(tree_unflatten(list(p.items())))
        return mean_ce(model, ids)

    loss, grads = mx.value_and_grad(loss_fn)(params)
    model.update(tree_unflatten(list(params.items())))
    mx.save_safetensors(str(Path(adapter) / "grads.safetensors"), grads)
    greedy = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        greedy.append(int(tok))
    return {"loss": loss.item(), "greedy": greedy, "shapes": {k: list(v.shape) for k, v in params.items()}}


def fuse(model, adapter, save_path):
    sys.argv = ["fuse", "--model", model, "--adapter-path", adapter, "--save-path", save_path]
    fuse_cli.main()


def check(args):
    tokens = [int(t) for t in args.tokens.split(",")]
    prompt = [int(t) for t in args.prompt.split(",")]
    out = {a: check_one(args.model, a, tokens, prompt, args.max_tokens) for a in args.adapters}
    if args.fuse_to:
        fuse(args.model, args.adapters[-1], args.fuse_to)
    return {"adapters": out}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    i = sub.add_parser("init")
    i.add_argument("--model", required=True)
    i.add_argument("--adapter-path", required=True)
    i.add_argument("--num-layers", type=int, default=2)
    i.add_argument("--rank", type=int, default=4)
    i.add_argument("--scale", type=float, default=2.0)
    i.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--adapters", nargs="+", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--prompt", required=True)
    c.add_argument("--max-tokens", type=int, default=8)
    c.add_argument("--fuse-to")
    f = sub.add_parser("fuse")
    f.add_argument("--model", required=True)
    f.add_argument("--adapter-path", required=True)
    f.add_argument("--save-path", required=True)
    args = p.parse_args()
    with contextlib.redirect_stdout(sys.stderr):
        if args.mode == "init":
            result = init(args)
        elif args.mode == "check":
            result = check(args)
        else:
            fuse(args.model, args.adapter_path, args.save_path)
            result = {"fused": args.save_path}
    sys.__stdout__.write(json.dumps(result) + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":
    sys.exit(main())
