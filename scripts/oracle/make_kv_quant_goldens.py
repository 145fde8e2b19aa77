"""Goldens for end-to-end KV quantization (`--kv-bits`): mlx-lm's greedy
tokens on the default model for two chat prompts over bits x group size,
with `quantized_kv_start=0`, how close each decision was, and how much
noise of the size of a kernel difference moves it.

For every prompt and cell this runs `generate_step` (greedy, max 48 tokens,
`kv_bits`, `kv_group_size`, `quantized_kv_start=0`, as `mlx_lm generate
--kv-bits B --kv-group-size G --quantized-kv-start 0 --max-tokens 48` does)
and records per step the top-5 tokens and their log-probabilities (the
first is the token chosen). Group 128 is left out: it does not divide the
model's head size of 64 (mlx-lm's `quantize` raises, mlx-bun refuses).

Two oracle configurations, both the pinned mlx-lm on the pinned MLX:

- "reference": this process, on the BLAS the mlx-cpu wheel bundles (the
  reference BLAS), as every other golden. Per cell it also measures the
  sensitivity of each decision: the same run teacher-forced on the recorded
  tokens, with every key and value entering the quantized cache (the dense
  prefill cache at conversion, and each new position) multiplied by
  (1 + 1e-6 * N(0, 1)) before quantization; `perturbed_gap_shift[t]` is how
  far that moves the log-probability gap between step t's top two tokens.
- "matched": a child process with OpenBLAS preloaded and one BLAS thread,
  the BLAS and threading the mlx-bun binary runs with, its kernels pinned to
  one core type (`OPENBLAS_CORETYPE=Haswell`: OpenBLAS otherwise picks them
  by CPU, and their sums round differently on another machine). mlx-bun with
  its own CPU kernels off (`MLX_BUN_CPU_KERNEL=0`) and the same core type
  then runs exactly MLX's ops, so its tokens must equal these.

Writes goldens/kv_quant.json with the oracle's versions, both BLAS lists and
the model's fingerprint (as make_goldens.py). About 11 minutes on 2 cores.

Usage: python make_kv_quant_goldens.py --model DIR [--out goldens/kv_quant.json]
       [--openblas /usr/lib/x86_64-linux-gnu/libopenblas.so.0] [--matched-only]

`--matched-only` reruns only the matched configuration and rewrites it into
the existing --out file (about half the time).
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.models import cache as cache_mod
from mlx_lm.utils import load

sys.path.insert(0, str(Path(__file__).parent))
from make_goldens import blas_libraries, meta  # noqa: E402

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a "
    "bottle. Describe the weather, the keeper's daily routine, and what the "
    "message says, in simple words.",
    "Explain to a beginner how a bicycle gear system works, why riders change "
    "gears when climbing a hill, and give three practical tips for shifting "
    "smoothly on a long ride.",
]
BITS = [2, 3, 4, 6, 8]
GROUPS = [32, 64]
MAX_TOKENS = 48
TOP_K = 5
NOISE = 1e-6


def top(lp):
    """The TOP_K most likely tokens as [id, log-prob], ties by lower id
    (argmax's choice)."""
    order = np.argsort(-lp, kind="stable")[:TOP_K]
    return [[int(i), float(lp[i])] for i in order]


def run(model, ids, bits, group, forced=None):
    """Greedy (or forced) generate_step: the tokens and, per step, the
    log-probabilities (numpy float32)."""
    tokens, steps = [], []
    sampler = None
    if forced is not None:
        # generate_step samples one token ahead of what it yields.
        it = itertools.chain(forced, itertools.repeat(0))

        def sampler(logprobs):
            return mx.array([next(it)])

    for token, logprobs in generate_step(
        mx.array(ids),
        model,
        max_tokens=len(forced) if forced is not None else MAX_TOKENS,
        sampler=sampler,
        kv_bits=bits,
        kv_group_size=group,
        quantized_kv_start=0,
    ):
        tokens.append(int(token))
        steps.append(np.array(logprobs.astype(mx.float32)))
    return tokens, steps


class Perturbed:
    """Multiplies every key and value entering the quantized cache by
    (1 + NOISE * N(0,1)), seeded, while active."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.to_q = cache_mod.KVCache.to_quantized
        self.upd = cache_mod.QuantizedKVCache.update_and_fetch

    def noisy(self, x):
        n = self.rng.standard_normal(x.shape).astype(np.float32)
        return x * (1 + NOISE * mx.array(n)).astype(x.dtype)

    def __enter__(self):
        outer = self

        def to_quantized(self, group_size=64, bits=4):
            if self.keys is not None:
                self.keys = outer.noisy(self.keys)
                self.values = outer.noisy(self.values)
            return outer.to_q(self, group_size=group_size, bits=bits)

        def update_and_fetch(self, keys, values):
            return outer.upd(self, outer.noisy(keys), outer.noisy(values))

        cache_mod.KVCache.to_quantized = to_quantized
        cache_mod.QuantizedKVCache.update_and_fetch = update_and_fetch

    def __exit__(self, *exc):
        cache_mod.KVCache.to_quantized = self.to_q
        cache_mod.QuantizedKVCache.update_and_fetch = self.upd


def prompt_ids(tokenizer, prompt):
    """The prompt ids as `mlx_lm generate --prompt` builds them."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def greedy_cells(model, tokenizer, p, ids, noise):
    eos = set(tokenizer.eos_token_ids)
    cells = []
    for bits in BITS:
        for group in GROUPS:
            tokens, lps = run(model, ids, bits, group)
            # generation stops at an end-of-sequence token (it is emitted).
            end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            tokens, lps = tokens[:end], lps[:end]
            steps = [top(lp) for lp in lps]
            assert [s[0][0] for s in steps] == tokens, "greedy picks the top-1"
            cell = {
                "bits": bits,
                "group_size": group,
                # as generated, an end-of-sequence token included
                "token_ids": tokens,
                "finish_reason": "stop" if tokens[-1] in eos else "length",
                "top": steps,
            }
            line = f"prompt {p} b{bits} g{group}: {len(tokens)} tokens"
            if noise:
                with Perturbed(seed=1000 * p + 10 * bits + group):
                    forced, plps = run(model, ids, bits, group, forced=tokens)
                assert forced == tokens
                # How far the gap between the same two ids moved.
                cell["perturbed_gap_shift"] = [
                    abs((s[0][1] - s[1][1]) - float(lp[s[0][0]] - lp[s[1][0]]))
                    for s, lp in zip(steps, plps)
                ]
                line += f", max gap shift {max(cell['perturbed_gap_shift']):.4g}"
            print(line, file=sys.stderr)
            cells.append(cell)
    return cells


def matched_child(model_dir):
    """The greedy runs alone, printed as JSON (run under OpenBLAS)."""
    model, tokenizer = load(str(model_dir))
    cases = [
        greedy_cells(model, tokenizer, p, prompt_ids(tokenizer, prompt), noise=False)
        for p, prompt in enumerate(PROMPTS)
    ]
    print(json.dumps({"blas": blas_libraries(), "cases": cases}))


def dumps(x, indent=0):
    """JSON with one line per list of numbers (a step's top-5 included), so
    the file stays small and diffs stay readable."""
    pad, inner = " " * indent, " " * (indent + 1)

    def flat(v):
        return not isinstance(v, (dict, list)) or (
            isinstance(v, list) and all(not isinstance(e, (dict, list)) for e in v)
        )

    if isinstance(x, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in x.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    if isinstance(x, list) and not all(flat(e) for e in x):
        items = [f"{inner}{dumps(v, indent + 1)}" for v in x]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(x, list) and any(isinstance(e, list) for e in x):
        return "[" + ", ".join(json.dumps(e) for e in x) + "]"
    return json.dumps(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--out", type=Path, default=Path("goldens/kv_quant.json"))
    ap.add_argument("--openblas", default="/usr/lib/x86_64-linux-gnu/libopenblas.so.0")
    ap.add_argument("--matched-only", action="store_true")
    ap.add_argument("--matched-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    if args.matched_child:
        return matched_child(args.model)

    matched_env = {
        "LD_PRELOAD": args.openblas,
        "OPENBLAS_NUM_THREADS": "1",
        "OPENBLAS_CORETYPE": "Haswell",
    }
    child = subprocess.Popen(
        [sys.executable, __file__, "--model", str(args.model), "--matched-child"],
        env={**os.environ, **matched_env},
        stdout=subprocess.PIPE,
    )
    if args.matched_only:
        doc = json.loads(args.out.read_text())
        cases = doc["cases"]
    else:
        model, tokenizer = load(str(args.model))
        cases = []
        for p, prompt in enumerate(PROMPTS):
            ids = prompt_ids(tokenizer, prompt)
            cells = greedy_cells(model, tokenizer, p, ids, noise=True)
            cases.append({"prompt": prompt, "prompt_ids": ids, "cells": cells})
    out, _ = child.communicate()
    assert child.returncode == 0, "the matched (OpenBLAS) run failed"
    matched = json.loads(out)
    assert any("openblas" in b for b in matched["blas"]), matched["blas"]
    for case, mcells in zip(cases, matched["cases"]):
        for cell, m in zip(case["cells"], mcells):
            assert (cell["bits"], cell["group_size"]) == (m["bits"], m["group_size"])
            cell["matched"] = {k: m[k] for k in ("token_ids", "finish_reason", "top")}
    if args.matched_only:
        doc["meta"]["matched_blas"] = matched["blas"]
        doc["meta"]["matched_env"] = matched_env
        args.out.write_text(dumps(doc) + "\n")
        return
    doc = {
        "meta": {
            **meta(args.model),
            "generator": "scripts/oracle/make_kv_quant_goldens.py",
            "matched_blas": matched["blas"],
            "matched_env": matched_env,
            "max_tokens": MAX_TOKENS,
            "quantized_kv_start": 0,
            "noise_relative": NOISE,
        },
        "cases": cases,
    }
    args.out.write_text(dumps(doc) + "\n")


if __name__ == "__main__":
    main()
