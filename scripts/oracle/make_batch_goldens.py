#!/usr/bin/env python3
"""Goldens for continuous batching from mlx-lm's own `BatchGenerator`.

For each model given, runs greedy batches of chat prompts of uneven lengths
and records every row's generated token ids:

  b2     two prompts inserted together
  b4     four prompts inserted together
  join   two prompts; after --join-after steps (`BatchGenerator.next()`
         calls) two more are inserted while the first two decode

    python scripts/oracle/make_batch_goldens.py \
        --model q4=~/.cache/mlx-bun/models/SmolLM2-135M-Instruct \
        --model f32=~/.cache/mlx-bun/test-models/smol-f32 \
        --out goldens/batch.json
"""
import argparse
import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm import load  # noqa: E402
from mlx_lm.generate import BatchGenerator  # noqa: E402

PROMPTS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "Name three colors of the rainbow, one per line."}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."},
        {"role": "user", "content": "Why do leaves change color in autumn? Explain simply."},
    ],
    [{"role": "user", "content": "Write the numbers from 1 to 5 as words."}],
]

SCENARIOS = {
    "b2": {"first": [1, 0], "later": []},
    "b4": {"first": [2, 0, 3, 1], "later": []},
    "join": {"first": [2, 1], "later": [0, 3]},
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(model_dir):
    d = Path(model_dir)
    return {
        "config_sha256": sha256(d / "config.json"),
        "weights_sha256": {p.name: sha256(p) for p in sorted(d.glob("*.safetensors"))},
    }


def run(model, tok, prompts, first, later, max_tokens, join_after, eos):
    gen = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=[[t] for t in eos],
        completion_batch_size=8,
        prefill_batch_size=4,
    )
    uids = {}
    for i, u in zip(first, gen.insert([prompts[i] for i in first], [max_tokens] * len(first))):
        uids[u] = i
    out = {i: [] for i in first + later}
    steps = 0
    inserted_later = not later
    rows_when_joined = None
    while True:
        if not inserted_later and steps == join_after:
            rows_when_joined = len(gen._generation_batch)
            for i, u in zip(later, gen.insert([prompts[i] for i in later], [max_tokens] * len(later))):
                uids[u] = i
            inserted_later = True
        responses = gen.next_generated()
        steps += 1
        if not responses and inserted_later:
            break
        for r in responses:
            if r.finish_reason != "stop":
                out[uids[r.uid]].append(r.token)
    gen.close()
    return out, rows_when_joined


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--join-after", type=int, default=6)
    a = ap.parse_args()

    models = {}
    for spec in a.model:
        name, path = spec.split("=", 1)
        path = os.path.expanduser(path)
        model, tok = load(path)
        prompts = [
            tok.encode(
                tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )
            for m in PROMPTS
        ]
        eos = sorted(tok.eos_token_ids)
        scenarios = {}
        for sname, s in SCENARIOS.items():
            out, joined = run(
                model, tok, prompts, s["first"], s["later"], a.max_tokens, a.join_after, eos
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
            "prompt_ids": prompts,
            "scenarios": scenarios,
        }
    doc = {
        "meta": {
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "max_tokens": a.max_tokens,
            "messages": PROMPTS,
        },
        "models": models,
    }
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
