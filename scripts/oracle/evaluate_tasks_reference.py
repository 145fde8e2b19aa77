#!/usr/bin/env python3
"""Rolling log-likelihood and generation reference with mlx-lm (the oracle
for `mlx-bun evaluate`'s wikitext-style and gsm8k-style tasks).

As evaluate_reference.py, the harness's two imports in `mlx_lm/evaluate.py`
are replaced by stand-ins; the requests go to mlx-lm's own
`MLXLM.loglikelihood_rolling` and `MLXLM.generate_until`.

Input: a JSON file {"rolling": [str], "generate": [{"context": str,
"until": [str], "max_gen_toks": int}]} (the document texts and prompts as
`mlx-bun evaluate --json` renders them). Output: one JSON object
{"loglikelihoods": [float], "generations": [str]}.

  evaluate_tasks_reference.py --model M --requests requests.json [--batch-size 1]

`--batch-size` is MLXLM's: 1 (the default here) scores and decodes each
request alone, as mlx-bun does; larger batches pad, which changes the
floating-point sums slightly.

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from evaluate_reference import Request, stub_harness  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--requests", required=True)
    p.add_argument("--batch-size", type=int, default=1)
    a = p.parse_args()

    stub_harness()
    from mlx_lm.evaluate import MLXLM

    with open(a.requests) as f:
        reqs = json.load(f)
    lm = MLXLM(a.model, use_chat_template=False, batch_size=a.batch_size)
    out = {"loglikelihoods": [], "generations": []}
    with contextlib.redirect_stdout(sys.stderr):
        rolling = [Request(doc, None) for doc in reqs.get("rolling", [])]
        if rolling:
            out["loglikelihoods"] = lm.loglikelihood_rolling(rolling)
        gen = [
            Request(
                g["context"], {"until": g["until"], "max_gen_toks": g["max_gen_toks"]}
            )
            for g in reqs.get("generate", [])
        ]
        if gen:
            out["generations"] = lm.generate_until(gen)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
