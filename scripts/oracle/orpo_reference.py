#!/usr/bin/env python3
"""ORPO reference: the ORPO quantities of preference pairs on a model.

Independent of mlx-bun: the model and tokenizer come from mlx-lm, each
sequence (prompt + chosen, prompt + rejected) runs through its own full
forward pass, and the ORPO math is done in float64 numpy.

Per pair (response = the assistant turn as the chat template renders it):
  l_w, l_r     mean log-prob of the chosen / rejected response tokens
  log_odds     (l_w - l_r) - (log1mexp(l_w) - log1mexp(l_r))
  or           -log sigmoid(log_odds)
  nll_full     token-mean cross-entropy over every next-token position of
               prompt + chosen (TRL / the ORPO paper)
  nll_response -l_w
For a batch (consecutive rows, --batch-size): the full-scope NLL is the
token mean over the whole batch, the response-scope NLL and OR are means
over pairs, loss = nll + lambda * or.

Usage: orpo_reference.py --model M --data-file F [--batch-size N] [--lambda L]
Prints one JSON object on stdout.
"""

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx
import numpy as np

from mlx_lm.utils import load


def log1mexp(x):
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > -np.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def messages(value, role):
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return list(value)


def encode_pair(tokenizer, row):
    """Prompt ids and the two response ids, split at the rendered prompt."""
    prompt = messages(row["prompt"], "user")
    if tokenizer.chat_template is None:
        eos = [tokenizer.eos_token_id]
        enc = lambda s: tokenizer.encode(s, add_special_tokens=False)
        return enc(row["prompt"]), enc(row["chosen"]) + eos, enc(row["rejected"]) + eos
    prompt_text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)

    def response(value):
        reply = messages(value, "assistant")
        if reply[: len(prompt)] == prompt and len(reply) > len(prompt):
            reply = reply[len(prompt) :]
        full = tokenizer.apply_chat_template(prompt + reply, tokenize=False)
        assert full.startswith(prompt_text), "template does not extend the prompt"
        return tokenizer.encode(full[len(prompt_text) :], add_special_tokens=False)

    ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    return ids, response(row["chosen"]), response(row["rejected"])


def token_logprobs(model, ids):
    """log p(ids[t] | ids[:t]) for t = 1..len-1, float64."""
    x = mx.array([ids], dtype=mx.int32)
    logits = model(x[:, :-1]).astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    picked = mx.take_along_axis(logp, x[:, 1:, None], axis=-1)[0, :, 0]
    return np.array(picked, dtype=np.float64)


def pair_terms(model, prompt, chosen, rejected):
    p = len(prompt)
    lc = token_logprobs(model, prompt + chosen)
    lr = token_logprobs(model, prompt + rejected)
    # Position t predicts token t+1: response tokens start at index p - 1.
    lw, lrj = lc[p - 1 :].mean(), lr[p - 1 :].mean()
    odds = (lw - lrj) - (log1mexp(lw) - log1mexp(lrj))
    return {
        "prompt_tokens": p,
        "chosen_tokens": len(chosen),
        "rejected_tokens": len(rejected),
        "chosen_logp": float(lw),
        "rejected_logp": float(lrj),
        "log_odds": float(odds),
        "or": float(np.logaddexp(0.0, -odds)),
        "nll_response": float(-lw),
        "nll_full": float(-lc.sum() / len(lc)),
        "full_sum": float(lc.sum()),
        "full_count": len(lc),
    }


def batch_terms(pairs, lam):
    out = {}
    or_mean = float(np.mean([t["or"] for t in pairs]))
    nll = {
        "full": -sum(t["full_sum"] for t in pairs) / sum(t["full_count"] for t in pairs),
        "response": float(np.mean([t["nll_response"] for t in pairs])),
    }
    for scope, n in nll.items():
        out[scope] = {
            "loss": n + lam * or_mean,
            "nll": n,
            "or": or_mean,
            "log_odds": float(np.mean([t["log_odds"] for t in pairs])),
            "chosen_logp": float(np.mean([t["chosen_logp"] for t in pairs])),
            "rejected_logp": float(np.mean([t["rejected_logp"] for t in pairs])),
        }
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data-file", required=True)
    ap.add_argument("--adapter-path", default=None)
    ap.add_argument("--batch-size", type=int, default=0, help="0: one batch of every row")
    ap.add_argument("--lambda", dest="lam", type=float, default=0.1)
    args = ap.parse_args()
    with contextlib.redirect_stdout(sys.stderr):
        model, tokenizer = load(args.model, adapter_path=args.adapter_path)
        rows = [json.loads(l) for l in open(args.data_file) if l.strip()]
        pairs = [pair_terms(model, *encode_pair(tokenizer, r)) for r in rows]
    bs = args.batch_size or len(pairs)
    batches = [batch_terms(pairs[i : i + bs], args.lam) for i in range(0, len(pairs) - bs + 1, bs)]
    sys.stdout.write(json.dumps({"pairs": pairs, "batches": batches, "lambda": args.lam}) + "\n")


if __name__ == "__main__":
    main()
