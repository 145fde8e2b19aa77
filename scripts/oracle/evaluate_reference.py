#!/usr/bin/env python3
"""Log-likelihood reference with mlx-lm (the oracle for `mlx-bun evaluate`).

lm-evaluation-harness is not part of the oracle environment (it pulls in
torch), so this script scores requests with `mlx_lm.evaluate.MLXLM.loglikelihood`
itself: the module's two imports from the harness (`LM`, the base class, and
`register_model`, a decorator) are replaced by minimal stand-ins before the
import. Everything that touches the model is mlx-lm's code.

Input: a JSON file of items, each {"context": str, "choices": [str], "gold": int}
(the contexts as `mlx-bun evaluate --json` renders them). Each choice is scored
as the continuation " " + choice (the harness's target delimiter). Output: one
JSON object with every choice's log-likelihood and the harness's acc and
acc_norm (log-likelihood divided by the choice's length in characters).

  evaluate_reference.py --model M --items items.json

Only mlx-lm, mlx and numpy are used: nothing of mlx-bun.
"""

import argparse
import contextlib
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np


def stub_harness():
    lm_eval = types.ModuleType("lm_eval")
    api = types.ModuleType("lm_eval.api")
    model = types.ModuleType("lm_eval.api.model")
    registry = types.ModuleType("lm_eval.api.registry")

    class LM:
        def __init__(self, *args, **kwargs):
            pass

    model.LM = LM
    registry.register_model = lambda *names: (lambda cls: cls)
    lm_eval.api = api
    api.model = model
    api.registry = registry
    for name, mod in [
        ("lm_eval", lm_eval),
        ("lm_eval.api", api),
        ("lm_eval.api.model", model),
        ("lm_eval.api.registry", registry),
    ]:
        sys.modules[name] = mod


class Request:
    def __init__(self, context, continuation):
        self.args = (context, continuation)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--items", required=True)
    a = p.parse_args()

    stub_harness()
    from mlx_lm.evaluate import MLXLM

    with open(a.items) as f:
        items = json.load(f)
    lm = MLXLM(a.model, use_chat_template=False)
    requests = [Request(it["context"], " " + c) for it in items for c in it["choices"]]
    with contextlib.redirect_stdout(sys.stderr):
        results = lm.loglikelihood(requests)
    lls, acc, acc_norm, k = [], [], [], 0
    for it in items:
        n = len(it["choices"])
        ll = [r[0] for r in results[k : k + n]]
        k += n
        lens = np.array([float(len(c)) for c in it["choices"]])
        acc.append(float(np.argmax(ll) == it["gold"]))
        acc_norm.append(float(np.argmax(np.array(ll) / lens) == it["gold"]))
        lls.append(ll)
    print(
        json.dumps(
            {
                "loglikelihoods": lls,
                "acc": float(np.mean(acc)),
                "acc_norm": float(np.mean(acc_norm)),
            }
        )
    )


if __name__ == "__main__":
    main()
