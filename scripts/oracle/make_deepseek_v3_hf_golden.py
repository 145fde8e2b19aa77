#!/usr/bin/env python3
"""A Hugging Face layout of the tiny DeepSeek-V3 checkpoint, with mlx-lm's
logits for it: goldens/arch/deepseek_v3 rewritten as Hugging Face stores
DeepSeek-V3 (the unsplit `kv_b_proj`, here 4-bit quantized by MLX, and the
experts one by one; mlx-lm drops only a 61st layer as the
multi-token-prediction one, so none is added here), loaded
by mlx-lm 0.32.2 (`sanitize` splits, requantizes and stacks) and run once.

    python scripts/oracle/make_deepseek_v3_hf_golden.py --out goldens/deepseek_v3_hf_q4
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model

TOKENS = [1, 17, 42, 99, 3, 250, 7, 7, 128, 64, 5, 200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="goldens/arch/deepseek_v3")
    ap.add_argument("--out", default="goldens/deepseek_v3_hf_q4")
    a = ap.parse_args()
    src, out = Path(a.src), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = mx.load(str(src / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    rank, experts = config["kv_lora_rank"], config["n_routed_experts"]
    quant = {"group_size": 32, "bits": 4}
    hf = {}
    for k, v in weights.items():
        if k.endswith(".embed_q.weight"):
            p = k[: -len(".embed_q.weight")]
            wv = weights[p + ".unembed_out.weight"]
            kv_b = mx.concatenate([v.swapaxes(-1, -2), wv], axis=1).reshape(-1, rank)
            q, s, b = mx.quantize(kv_b, **quant)
            hf.update({p + ".kv_b_proj.weight": q, p + ".kv_b_proj.scales": s, p + ".kv_b_proj.biases": b})
        elif k.endswith(".unembed_out.weight"):
            continue
        elif ".mlp.switch_mlp." in k:
            p, proj = k.split(".mlp.switch_mlp.")
            for e in range(experts):
                hf[f"{p}.mlp.experts.{e}.{proj}"] = v[e]
        else:
            hf[k] = v
    # Only kv_b_proj is quantized: every other layer named dense.
    config["quantization"] = dict(quant)
    for k, v in hf.items():
        if k.endswith(".weight") and v.ndim >= 2 and ".kv_b_proj." not in k:
            config["quantization"][k[: -len(".weight")]] = False
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.save_safetensors(str(out / "model.safetensors"), hf, metadata={"format": "mlx"})
    model, _ = load_model(out)
    ids = mx.array(TOKENS)[None]
    mx.save_safetensors(
        str(out / "expected.safetensors"),
        {"tokens": mx.array(TOKENS, dtype=mx.int32), "full": model(ids)[0]},
    )
    print(out, "ok")


if __name__ == "__main__":
    main()
