#!/usr/bin/env python3
"""Goldens for speculative decoding from mlx-lm's own speculative path.

Runs `stream_generate(..., draft_model=...)` greedily for a few chat prompts
and draft lengths, recording the emitted token ids and which of them came
from the draft (mlx-lm's `from_draft`).

    python scripts/oracle/make_spec_goldens.py --target T --draft D --out goldens/speculative.json
"""
import argparse
import hashlib
import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

PROMPTS = [
    [{"role": "user", "content": "List three colors."}],
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name two planets."},
    ],
]


def config_hash(path):
    return hashlib.sha256(Path(path, "config.json").read_bytes()).hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--num-draft", type=int, nargs="+", default=[2, 3])
    a = ap.parse_args()

    model, tok = load(a.target)
    draft, _ = load(a.draft)
    cases = []
    for messages in PROMPTS:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        for k in a.num_draft:
            tokens, from_draft = [], []
            for r in stream_generate(
                model,
                tok,
                mx.array(ids),
                max_tokens=a.max_tokens,
                sampler=make_sampler(temp=0.0),
                draft_model=draft,
                num_draft_tokens=k,
            ):
                if r.finish_reason is not None and r.token in tok.eos_token_ids:
                    break
                tokens.append(int(r.token))
                from_draft.append(bool(r.from_draft))
            cases.append(
                {
                    "messages": messages,
                    "prompt_ids": ids,
                    "num_draft_tokens": k,
                    "max_tokens": a.max_tokens,
                    "tokens": tokens,
                    "from_draft": from_draft,
                    "accepted": sum(from_draft),
                }
            )
            print(f"k={k} accepted {sum(from_draft)}/{len(tokens)}")
    out = {
        "generator": "scripts/oracle/make_spec_goldens.py",
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "target_config": config_hash(a.target),
        "draft_config": config_hash(a.draft),
        "cases": cases,
    }
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
