#!/usr/bin/env python3
"""Greedy parity on a GPU: mlx-lm and mlx-bun on the same model, same MLX.

Runs a few chat prompts through mlx-lm's `stream_generate` (greedy) and
through `mlx-bun generate --json` (the binary given by --bin, e.g. the GPU
bundle's run.sh), and compares the generated token ids. Prints one line per
prompt and writes a JSON report.

    python scripts/oracle/gpu_parity.py --bin target/gpu-bundle/run.sh \
        --model DIR --out report.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
from mlx_lm import load, stream_generate  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "List three colors."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]


def oracle(model, tok, messages, max_tokens):
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    out = []
    for r in stream_generate(model, tok, mx.array(ids), max_tokens=max_tokens,
                             sampler=make_sampler(temp=0.0)):
        if r.finish_reason is not None and r.token in tok.eos_token_ids:
            break
        out.append(r.token)
    return out


def ours(binary, model_dir, messages, max_tokens):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(messages, f)
    t = time.perf_counter()
    res = subprocess.run(
        [binary, "generate", "--model", model_dir, "--messages-file", f.name,
         "-n", str(max_tokens), "--json"],
        capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1]), time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--out")
    a = ap.parse_args()
    model, tok = load(a.model)
    cases, same = [], 0
    for messages in PROMPTS:
        want = oracle(model, tok, messages, a.max_tokens)
        got, secs = ours(a.bin, a.model, messages, a.max_tokens)
        # Two empty outputs are a failure, not a match.
        equal = bool(want) and got["token_ids"] == want
        same += equal
        cases.append({"messages": messages, "mlx_lm": want, "mlx_bun": got["token_ids"],
                      "equal": equal, "mlx_bun_process_s": secs,
                      "mlx_bun_generation_tps": got["generation_tps"]})
        first = next((i for i, (a, b) in enumerate(zip(want, got["token_ids"])) if a != b),
                     min(len(want), len(got["token_ids"])))
        cases[-1]["first_difference"] = None if equal else first
        print(f"{'EQUAL' if equal else f'DIFFERENT from token {first}'}: {len(want)} tokens; "
              f"mlx-bun process {secs:.1f} s, decode {got['generation_tps']:.0f} tok/s")
    print(f"{same}/{len(PROMPTS)} prompts token-identical (mlx {mx.__version__}, "
          f"device {mx.default_device()})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"mlx": mx.__version__, "device": str(mx.default_device()),
                       "cases": cases}, f, indent=1)
    sys.exit(0 if same == len(PROMPTS) else 1)


if __name__ == "__main__":
    main()
