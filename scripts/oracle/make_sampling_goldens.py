#!/usr/bin/env python3
"""Writes goldens/sampling.json: mlx-lm's seeded sampling on a model, for
mlx-bun to reproduce token for token.

Run with the oracle interpreter (scripts/oracle/setup.sh prints its path):

    "$(scripts/oracle/setup.sh)" scripts/oracle/make_sampling_goldens.py \
        --model DIR --out goldens/sampling.json

For every prompt x seed x sampler setting it records two streams:
  generate  `mlx_lm.generate --seed S`: the seed is set, then the model is
            loaded (its layers draw from the seeded stream while they are
            built), then the sampler and processors run (main()'s order).
  server    `mlx_lm.server` with `"seed": S`: the seed is set just before
            generation (_serve_single), so the stream starts at key(S). Its
            per-token log-probabilities (after the processors, as the server
            reports them) and the top 5 are recorded too.
Both use mlx-lm's own make_sampler / make_logits_processors, with XTC's
special tokens as mlx-lm's CLI and server pick them, and stop at an end token.
Each draw records whether it is fragile (see `fragile`), so a test can tell
a draw that numerical noise may flip from a real divergence.
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
from mlx_lm import load  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.sample_utils import (  # noqa: E402
    apply_min_p,
    apply_top_k,
    apply_top_p,
    make_logits_processors,
    make_sampler,
)

from make_goldens import meta  # noqa: E402

PROMPTS = [
    "Write a short poem about autumn.",
    "Explain what a CPU cache is.",
    "List three fruits and their colors.",
    "Tell me a story about a robot who learns to paint.",
]
SEEDS = [0, 42, 1234]
TOP_LOGPROBS = 5

# Each setting names the fields of an OpenAI/mlx-lm request body.
SETTINGS = [
    {"name": "temperature", "temperature": 0.8},
    {"name": "top_p", "temperature": 0.9, "top_p": 0.9},
    {"name": "top_k", "temperature": 1.0, "top_k": 20},
    {"name": "min_p", "temperature": 0.7, "min_p": 0.1},
    {
        "name": "penalties",
        "temperature": 0.8,
        "repetition_penalty": 1.3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.3,
    },
    {"name": "logit_bias", "temperature": 0.8, "logit_bias": {"28": -100.0, "30": 4.0}},
    {"name": "xtc", "temperature": 0.8, "xtc_probability": 0.5, "xtc_threshold": 0.1},
]


def sampler_for(setting: dict, tokenizer):
    return make_sampler(
        setting.get("temperature", 0.0),
        top_p=setting.get("top_p", 0.0),
        min_p=setting.get("min_p", 0.0),
        top_k=setting.get("top_k", 0),
        xtc_probability=setting.get("xtc_probability", 0.0),
        xtc_threshold=setting.get("xtc_threshold", 0.1),
        xtc_special_tokens=tokenizer.encode("\n") + list(tokenizer.eos_token_ids),
    )


# Our logits differ from mlx-lm's by up to ~1e-4 (another BLAS order and our
# CPU kernels; docs/parity.md). A draw is fragile when scores perturbed by
# that much can make the same key draw another token.
NOISE = 2e-4
TRIALS = 16


def fragile(scores, key, token: int) -> bool:
    """MLX's categorical draw depends on every score, not on the drawn
    token's alone: perturb them all, TRIALS times, by NOISE."""
    for i in range(TRIALS):
        noise = mx.random.normal(scores.shape, key=mx.random.key(10_000 + i)) * NOISE
        if int(mx.random.categorical(scores + noise, key=key)[0]) != token:
            return True
    return False


def recording(setting: dict, tokenizer, fragility: list):
    """mlx-lm's sampler, noting whether each draw is fragile (see
    `fragile`): such a draw may fall either way for logits that differ in
    their last bits. XTC draws a second key per step: not recorded there."""
    sampler = sampler_for(setting, tokenizer)
    temp = setting["temperature"]
    chain = []
    if 0 < setting.get("top_p", 0.0) < 1.0:
        chain.append(lambda x: apply_top_p(x, setting["top_p"]))
    if setting.get("min_p", 0.0) != 0.0:
        chain.append(lambda x: apply_min_p(x, setting["min_p"]))
    if setting.get("top_k", 0) > 0:
        chain.append(lambda x: apply_top_k(x, setting["top_k"]))

    def sample(logprobs):
        if setting.get("xtc_probability", 0.0) > 0.0:
            fragility.append(None)
            return sampler(logprobs)
        _, key = mx.random.split(mx.random.state[0])
        filtered = logprobs
        for f in chain:
            filtered = f(filtered)
        scores = filtered * (1.0 / temp)
        token = sampler(logprobs)
        replay = mx.random.categorical(scores, key=key)
        if int(replay[0]) != int(token[0]):
            raise RuntimeError("the replayed draw picked another token")
        fragility.append(fragile(scores, key, int(token[0])))
        return token

    return sample


def processors_for(setting: dict):
    bias = setting.get("logit_bias")
    return make_logits_processors(
        {int(k): float(v) for k, v in bias.items()} if bias else None,
        setting.get("repetition_penalty"),
        20,
        setting.get("presence_penalty"),
        20,
        setting.get("frequency_penalty"),
        20,
    )


def prompt_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def run(model, tokenizer, ids, setting, max_tokens, with_logprobs):
    tokens, logprobs, tops, fragility = [], [], [], []
    stream = generate_step(
        mx.array(ids),
        model,
        max_tokens=max_tokens,
        sampler=recording(setting, tokenizer, fragility),
        logits_processors=processors_for(setting),
    )
    finish = "length"
    for token, lp in stream:
        token = int(token)
        if token in tokenizer.eos_token_ids:
            finish = "stop"
            break
        tokens.append(token)
        if with_logprobs:
            logprobs.append(lp[token].item())
            top = mx.argpartition(-lp, kth=TOP_LOGPROBS - 1)[:TOP_LOGPROBS].tolist()
            tops.append(sorted(([i, lp[i].item()] for i in top), key=lambda e: -e[1]))
    out = {"tokens": tokens, "finish_reason": finish, "fragile": fragility[: len(tokens) + 1]}
    if with_logprobs:
        out["logprobs"] = logprobs
        out["top_logprobs"] = tops
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    model_dir = Path(args.model)

    model, tokenizer = load(str(model_dir))
    cases = []
    for setting in SETTINGS:
        for p, text in enumerate(PROMPTS):
            ids = prompt_ids(tokenizer, text)
            for seed in SEEDS:
                # mlx_lm.generate: seed, then load (construction draws), then sample.
                mx.random.seed(seed)
                fresh, _ = load(str(model_dir))
                generate = run(fresh, tokenizer, ids, setting, args.max_tokens, False)
                del fresh
                # mlx_lm.server: seed right before generation.
                mx.random.seed(seed)
                server = run(model, tokenizer, ids, setting, args.max_tokens, True)
                cases.append(
                    {
                        "setting": setting,
                        "prompt": text,
                        "prompt_ids": ids,
                        "seed": seed,
                        "generate": generate,
                        "server": server,
                    }
                )
                print(
                    f"{setting['name']} prompt {p} seed {seed}: "
                    f"{len(generate['tokens'])}/{len(server['tokens'])} tokens",
                    file=sys.stderr,
                )
    doc = {
        "meta": {**meta(model_dir), "generator": "scripts/oracle/make_sampling_goldens.py"},
        "max_tokens": args.max_tokens,
        "top_logprobs": TOP_LOGPROBS,
        "cases": cases,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
