#!/usr/bin/env python3
"""Goldens for continuous batching of hybrid models, from mlx-lm's own
`BatchGenerator` (whose recurrent and convolution layers hold `ArraysCache`
beside the `BatchKVCache` of the attention layers).

Runs the tiny random checkpoints of goldens/arch/ (made by
make_arch_goldens.py) of Qwen3-Next (gated DeltaNet layers, MoE experts),
Qwen3.5 and Qwen3.5-MoE (gated DeltaNet layers, nested `text_config`) and
LFM2 (short convolution layers) and Nemotron-H (Mamba-2 layers, MLP and
experts layers without a cache) on token-id prompts of uneven lengths, and records
every row's greedy tokens in the scenarios of make_batch_goldens.py:

  b2     two prompts inserted together
  b4     four prompts of uneven lengths inserted together
  join   two prompts; after --join-after steps two more are inserted while
         the first two decode

It also records each prompt's serial greedy tokens (`generate_step`) and
the batch cache class of every layer, so a reader sees that batch and serial
agree in mlx-lm too and which layers keep a state. The 4-bit Qwen3-Next
and Qwen3.5-MoE checkpoints are not among them: mlx-lm's CPU build cannot
run their quantized MoE experts (`gather_qmm` rejects the arguments), in a
batch or alone; nor, for the same reason, are granitemoehybrid_q4 (its
dense and experts variants are: granitemoehybrid, granitemoehybrid_dense)
and nemotron_h_moe_q4 (nemotron_h_moe is).

mlx-lm's BatchGenerator right-pads the prompts of rows inserted together,
and Nemotron-H's Mamba-2 scan (`ssm_attn`, not given the row lengths) then
leaves a zero state in every row shorter than the longest: its batch tokens
for those rows are not its serial ones (nemotron_h_q4 shows it; nemotron_h's
greedy tokens happen to survive). For Nemotron-H the serial tokens are the
reference (tests/batch_hybrid.rs).

    python scripts/oracle/make_batch_hybrid_goldens.py \
        --model qwen3_next=goldens/arch/qwen3_next \
        --model qwen3_5=goldens/arch/qwen3_5 \
        --model qwen3_5_q4=goldens/arch/qwen3_5_q4 \
        --model qwen3_5_moe=goldens/arch/qwen3_5_moe \
        --model lfm2=goldens/arch/lfm2 \
        --model lfm2_q4=goldens/arch/lfm2_q4 \
        --model nemotron_h=goldens/arch/nemotron_h \
        --model nemotron_h_q4=goldens/arch/nemotron_h_q4 \
        --model nemotron_h_moe=goldens/arch/nemotron_h_moe \
        --model nemotron_h_moe_latent=goldens/arch/nemotron_h_moe_latent \
        --model granitemoehybrid=goldens/arch/granitemoehybrid \
        --model granitemoehybrid_dense=goldens/arch/granitemoehybrid_dense \
        --out goldens/batch_hybrid.json
"""
import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402

from make_batch_goldens import SCENARIOS, fingerprint, run  # noqa: E402
from make_batch_sliding_goldens import batch_cache_kinds, serial  # noqa: E402

# Lengths 9, 14, 7 and 20: longer than the convolution kernels (4 and 3), so
# every row's convolution state holds only its own prompt.
PROMPTS = [
    [1, 17, 42, 99, 3, 250, 7, 7, 128],
    [64, 5, 200, 9, 11, 31, 4, 77, 160, 2, 90, 13, 54, 201],
    [8, 16, 32, 64, 128, 255, 1],
    [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--join-after", type=int, default=6)
    a = ap.parse_args()

    models = {}
    for spec in a.model:
        name, path = spec.split("=", 1)
        path = os.path.expanduser(path)
        model, _ = load_model(Path(path))
        scenarios = {}
        for sname, s in SCENARIOS.items():
            out, joined = run(
                model, None, PROMPTS, s["first"], s["later"], a.max_tokens, a.join_after, []
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
            "batch_caches": batch_cache_kinds(model, PROMPTS[0]),
            "serial_tokens": [serial(model, p, a.max_tokens) for p in PROMPTS],
            "scenarios": scenarios,
        }
    doc = {
        "meta": {
            "command": "python " + " ".join(sys.argv),
            "mlx": mx.__version__,
            "mlx_lm": mlx_lm.__version__,
            "max_tokens": a.max_tokens,
            "prompt_ids": PROMPTS,
        },
        "models": models,
    }
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
